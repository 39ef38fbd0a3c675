"""Where `tokenmill cluster` starts its engines: the launcher seam.

- `ProcessLauncher` (`--launcher process`, the default): `tokenmill serve` processes on this
  machine, each pinned to its share of the cores, on consecutive loopback ports.
- `RayLauncher` (`--launcher ray`, extra `tokenmill[ray]`): each engine a Ray actor
  (tokenmill/ray/) placed by Ray, engine i on a node that has custom resource
  `--ray-node-resources[i % n]`; Ray restarts an engine that dies, on the same port.

Both return the engines' URLs, which is all the router and the planner ever see.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import httpx


class EngineLauncher(Protocol):
    def start(self, index: int, engine_args: list[str], cores: list[int]) -> str: ...

    def wait_ready(self, timeout: float = 300.0) -> None: ...

    def stop(self) -> None: ...


def wait_healthy(url: str, why_not: Callable[[], str | None], timeout: float, poll_s: float = 0.2) -> None:
    """Poll url/health every poll_s until 200; `why_not()` names a reason to give up early (the
    engine exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reason = why_not()
        if reason is not None:
            raise OSError(f"engine {url} {reason}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    raise OSError(f"engine {url} not healthy after {timeout:.0f} s")


class ProcessLauncher:
    def __init__(self, log_dir: Path, first_port: int) -> None:
        self.log_dir = log_dir
        self.first_port = first_port
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, index: int, engine_args: list[str], cores: list[int]) -> str:
        port = self.first_port + index
        cmd = [sys.executable, "-m", "tokenmill", "serve", *engine_args, "--num-threads", str(len(cores)),
               "--host", "127.0.0.1", "--port", str(port)]
        with open(self.log_dir / f"engine{index}.log", "wb") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=lambda c=cores: os.sched_setaffinity(0, set(c)))
        url = f"http://127.0.0.1:{port}"
        self.procs[url] = proc
        print(f"engine {index}: {url} on cores {cores} (log {self.log_dir / f'engine{index}.log'})", flush=True)
        return url

    def wait_ready(self, timeout: float = 300.0) -> None:
        for url, proc in self.procs.items():
            wait_healthy(url, lambda p=proc: None if p.poll() is None else f"exited with {p.returncode} (see its log)",
                         timeout)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


class RayLauncher:
    def __init__(self, log_dir: Path, first_port: int, address: str | None, node_resources: list[str],
                 num_cpus: float = 1.0, max_restarts: int = 3) -> None:
        from tokenmill.ray.launcher import connect
        connect(address)
        self.log_dir = log_dir
        self.first_port = first_port
        self.node_resources = node_resources
        self.num_cpus = num_cpus
        self.max_restarts = max_restarts
        self.engines = []

    def start(self, index: int, engine_args: list[str], cores: list[int]) -> str:
        from tokenmill.ray.launcher import RayEngine, RayPlacement
        resources = {self.node_resources[index % len(self.node_resources)]: 0.01} if self.node_resources else {}
        placement = RayPlacement(resources, num_cpus=self.num_cpus, max_restarts=self.max_restarts)
        engine = RayEngine(f"engine{index}", engine_args, self.first_port + index, placement, str(self.log_dir.resolve()))
        self.engines.append(engine)
        url = engine.wait_url()
        print(f"engine {index}: {url}, a Ray actor needing {resources or 'no custom resource'} "
              f"(log {self.log_dir / f'engine{index}.log'} on its node)", flush=True)
        return url

    def wait_ready(self, timeout: float = 300.0) -> None:
        for engine in self.engines:
            wait_healthy(engine.url, lambda: None, timeout)

    def stop(self) -> None:
        for engine in self.engines:
            engine.stop()


def make_launcher(args) -> EngineLauncher:
    if args.launcher == "process":
        return ProcessLauncher(args.log_dir, args.first_engine_port)
    return RayLauncher(args.log_dir, args.first_engine_port, args.ray_address, args.ray_node_resources,
                       args.ray_num_cpus)
