"""What the reliability runs observe: a server process of their own on loopback, its resources
(/proc: RSS, open fds, threads) and its /metrics (KV blocks, request tables, counters)."""
from __future__ import annotations

import asyncio
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

IDLE_GAUGES = ("tokenmill:kv_cache_used_blocks", "tokenmill:engine_requests", "tokenmill:engine_open_streams",
               "tokenmill:num_requests_running", "tokenmill:num_requests_waiting")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    """`python -m tokenmill.server ARGS` on 127.0.0.1 and a free port; its log goes to `log_path`."""
    args: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300.0) -> ServerProcess:
        repo = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   TOKENIZERS_PARALLELISM="false", **self.env)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "tokenmill.server", *self.args, "--host", "127.0.0.1",
                                      "--port", str(self.port), "--disable-access-log", "--disable-log-stats"],
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {timeout} s; log: {self.log_path}")
            time.sleep(0.1)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def resources(self) -> dict[str, float]:
        """RSS (MiB), open file descriptors and threads of the server process."""
        pid = self.proc.pid
        rss_kb = threads = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss_kb = int(line.split()[1])
                elif line.startswith("Threads:"):
                    threads = int(line.split()[1])
        return {"rss_mb": rss_kb / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": threads}


async def scrape(client: httpx.AsyncClient) -> dict[str, float]:
    """Every sample of /metrics summed over its labels, by sample name."""
    r = await client.get("/metrics")
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def wait_idle(client: httpx.AsyncClient, timeout: float) -> tuple[float | None, dict[str, float]]:
    """Seconds until every idle gauge is 0 (None if not within `timeout`), and the last scrape."""
    t0 = time.monotonic()
    while True:
        m = await scrape(client)
        if all(m.get(g, 0.0) == 0 for g in IDLE_GAUGES):
            return time.monotonic() - t0, m
        if time.monotonic() - t0 > timeout:
            return None, m
        await asyncio.sleep(0.05)


def linear_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs (0 with fewer than two points)."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0


async def histogram_share_within(client: httpx.AsyncClient, name: str, bound: float) -> tuple[float, float]:
    """(observations of histogram `name`, the share of them <= the smallest bucket edge >= bound),
    as the server measured them: no client or network time in it."""
    text = (await client.get("/metrics")).text
    buckets: dict[float, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != name:
            continue
        for s in fam.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    if not buckets:
        return 0.0, float("nan")
    total = buckets[max(buckets)]
    edge = min((le for le in buckets if le >= bound), default=max(buckets))
    return total, (buckets[edge] / total if total else float("nan"))
