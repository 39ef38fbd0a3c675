"""One replica of a pool: a `tokenmill serve` subprocess on loopback, pinned to the pool's cores.

Pinning uses os.sched_setaffinity in the child before it executes Python, so every thread the
engine starts (torch's, the kernels') inherits the mask; the engine's --num-threads defaults to the
number of pinned cores. Without cores the replica may run on every core (time-sliced with the others).
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import os
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
class ReplicaProcess:
    pool: Pool
    index: int
    log_dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    healthy: bool = False
    metrics: dict[str, float] = field(default_factory=lambda: dict.fromkeys(SCRAPED, 0.0))
    started_at: float = 0.0  # time.monotonic() when it became healthy

    @property
    def name(self) -> str:
        return f"{self.pool.name}-{self.index}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        p = self.pool
        args = [sys.executable, "-m", "tokenmill.server"]
        if p.model_path is not None:
            args.append(p.model_path)
        engine = dict(p.engine)
        if p.hardware.cores and "num_threads" not in engine:
            engine["num_threads"] = len(p.hardware.cores)
        args += replica_argv(engine)
        args += ["--served-model-name", p.model, "--price-per-hour", str(p.hardware.price_per_hour),
                 "--host", "127.0.0.1", "--port", str(self.port), "--disable-access-log", "--public-metrics"]
        if p.switch_group is not None:
            args.append("--enable-sleep-mode")
        return args

    def start(self) -> None:
        cores = self.pool.hardware.cores
        env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(self.argv(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: _in_child(cores))
        log.close()
        logger.info("replica %s: pid %d on port %d, cores %s", self.name, self.proc.pid, self.port,
                    cores if cores else "all (time-sliced)")

    async def wait_ready(self, client: httpx.AsyncClient, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited with {self.proc.returncode}; its log: "
                                   f"{self.log_dir / (self.name + '.log')}")
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
            self.healthy = self.proc is not None and self.proc.poll() is None and self.healthy
            return None
        self.metrics = parse_engine_metrics(r.text)
        return self.metrics

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.healthy = False
