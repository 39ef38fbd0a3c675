"""One replica of a pool: `Replica` is what the fleet sees (a name, a URL, health, scraped
metrics); `ReplicaProcess` is a `tokenmill serve` subprocess on loopback, pinned to the pool's
cores; a `launcher: ray` pool's replicas are `RayReplica`s (ray_replica.py). `make_replica` picks.

Pinning uses os.sched_setaffinity in the child before it executes Python, so every thread the
engine starts (torch's, the kernels') inherits the mask; the engine's --num-threads defaults to the
number of pinned cores. Without cores the replica may run on every core (time-sliced with the others).
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tokenmill.fleet.config import Pool, replica_argv

logger = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1

SCRAPED = ("tokenmill:engine_busy_seconds_total", "tokenmill:num_requests_running", "tokenmill:num_requests_waiting",
           "tokenmill:kv_cache_usage_perc", "tokenmill:kv_block_fill_ratio", "tokenmill:prefix_cache_queries_total",
           "tokenmill:prefix_cache_hits_total", "tokenmill:generation_tokens_total",
           "tokenmill:prompt_tokens_total")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _in_child(cores: list[int] | None) -> None:
    """Runs in the replica before it executes Python: die with the fleet, run on the pool's cores."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if cores:
        os.sched_setaffinity(0, cores)


def parse_engine_metrics(text: str) -> dict[str, float]:
    """The scraped series of one engine's /metrics, summed over their labels."""
    out = dict.fromkeys(SCRAPED, 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in out:
                out[s.name] += s.value
    return out


@dataclass
class Replica:
    """A replica as the fleet sees it; subclasses start, stop and say whether it still lives."""
    pool: Pool
    index: int
    log_dir: Path
    healthy: bool = False
    metrics: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SCRAPED, 0.0))
    started_at: float = 0.0  # time.monotonic() when it became healthy

    @property
    def name(self) -> str:
        return f"{self.pool.name}-{self.index}"

    @property
    def url(self) -> str:
        raise NotImplementedError

    @property
    def server_module(self) -> str:
        """What the replica runs: `tokenmill serve`, or `tokenmill serve-multi` for a `models:` pool."""
        return "tokenmill.server.multi_launch" if self.pool.models is not None else "tokenmill.server"

    def engine_args(self) -> list[str]:
        """`tokenmill serve` (or serve-multi) flags (no host or port) for this pool's engine."""
        p = self.pool
        engine = dict(p.engine)
        threads = len(p.hardware.cores) if p.hardware.cores else None
        if p.launcher == "ray":
            threads = max(1, int(p.ray_placement.num_cpus))
        if threads and "num_threads" not in engine:
            engine["num_threads"] = threads
        common = ["--price-per-hour", str(p.hardware.price_per_hour), "--disable-access-log", "--public-metrics"]
        if p.models is not None:
            args = []
            for m in p.models:
                own = ([m.model_path] if m.model_path is not None else []) + replica_argv({**engine, **m.engine})
                args += ["--model", f"{m.model}={shlex.join(own)}"]
            return args + ["--switch-quantum-s", str(p.switch_quantum_s), *common]
        args = [p.model_path] if p.model_path is not None else []
        args += replica_argv(engine)
        args += ["--served-model-name", p.model, *common]
        if p.switch_group is not None:
            args.append("--enable-sleep-mode")
        return args

    def start(self) -> None:
        raise NotImplementedError

    async def exit_reason(self) -> str | None:
        """Why the replica cannot become healthy any more (None: it may still)."""
        return None

    async def wait_ready(self, client: httpx.AsyncClient, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reason = await self.exit_reason()
            if reason is not None:
                raise RuntimeError(f"replica {self.name} {reason}; its log: {self.log_dir / (self.name + '.log')}")
            try:
                if (await client.get(self.url + "/health", timeout=2.0)).status_code == 200:
                    self.healthy = True
                    self.started_at = time.monotonic()
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        raise RuntimeError(f"replica {self.name} not healthy after {timeout:.0f} s")

    async def scrape(self, client: httpx.AsyncClient) -> dict[str, float] | None:
        try:
            r = await client.get(self.url + "/metrics", timeout=5.0)
            r.raise_for_status()
        except httpx.HTTPError:
            self.healthy = self.may_be_healthy()
            return None
        self.metrics = parse_engine_metrics(r.text)
        self.healthy = True  # e.g. back after a restart
        return self.metrics

    def may_be_healthy(self) -> bool:
        """After a failed scrape: keep routing to it? (a process that still runs: a slow scrape)"""
        return False

    def revive(self) -> bool:
        """Start the replica again if it died (not stopped); True if it did. Ray pools: Ray does it."""
        return False

    def stop(self, timeout: float = 15.0) -> None:
        raise NotImplementedError


RESTART_INTERVAL_S = 5.0  # a replica that keeps dying is started again at most this often


@dataclass
class ReplicaProcess(Replica):
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    stopped: bool = False
    last_start: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", self.server_module, *self.engine_args(), "--host", "127.0.0.1",
                "--port", str(self.port)]

    def start(self) -> None:
        cores = self.pool.hardware.cores
        env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(self.argv(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: _in_child(cores))
        self.last_start = time.monotonic()
        log.close()
        logger.info("replica %s: pid %d on port %d, cores %s", self.name, self.proc.pid, self.port,
                    cores if cores else "all (time-sliced)")

    async def exit_reason(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"exited with {self.proc.returncode}"
        return None

    def may_be_healthy(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.healthy

    def revive(self) -> bool:
        if (self.stopped or self.proc is None or self.proc.poll() is None
                or time.monotonic() - self.last_start < RESTART_INTERVAL_S):
            return False
        logger.warning("replica %s exited with %s: starting it again on port %d", self.name, self.proc.returncode,
                       self.port)
        self.healthy = False
        self.start()
        return True

    def stop(self, timeout: float = 15.0) -> None:
        self.stopped = True
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.healthy = False


def make_replica(pool: Pool, index: int, log_dir: Path) -> Replica:
    """The pool's launcher decides what a replica is."""
    if pool.launcher == "ray":
        from tokenmill.fleet.ray_replica import RayReplica
        return RayReplica(pool, index, log_dir)
    return ReplicaProcess(pool, index, log_dir)
