"""One engine replica as a Ray actor: it runs `python -m tokenmill.server` on its node, bound to
the node's address (what Ray calls the node IP), and says where it listens.

The engine stays a process of its own (its threads, its kernels, its HTTP server: the same program
as `tokenmill serve`); the actor owns it. Their lifetimes are tied both ways: the engine gets
SIGTERM when the actor's process dies (PR_SET_PDEATHSIG), and the actor's process exits when the
engine does, so Ray sees a dead actor and restarts it (`max_restarts`) on a node that still meets
its placement (its custom resources): the restarted actor starts a new engine on the same port,
so routers keep the URL. `stop` ends the engine on purpose (no restart follows).
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_port_free(host: str, port: int, timeout: float = 30.0) -> None:
    """A restarted actor may come up before the engine it replaces has let go of the port."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise OSError(f"port {host}:{port} is still in use after {timeout:.0f} s") from None
        time.sleep(0.2)


class EngineActor:
    """Ray wraps this class with `ray.remote` (see launcher.py); its methods run in the actor."""

    def __init__(self, name: str, engine_args: list[str], port: int, log_dir: str | None = None) -> None:
        import ray
        self.name = name
        self.host = ray.util.get_node_ip_address()
        self.port = port
        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        self.restarted = ctx.was_current_actor_reconstructed
        _wait_port_free(self.host, port)
        # the engine imports the same tokenmill as this actor (a worktree or an install)
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
                   PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
        cmd = [sys.executable, "-m", "tokenmill.server", *engine_args, "--host", self.host, "--port", str(port)]
        out = subprocess.DEVNULL
        if log_dir:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
            out = open(Path(log_dir) / f"{name}.log", "ab")
        self.proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        self._stopping = False
        threading.Thread(target=self._exit_with_engine, daemon=True, name="engine-watch").start()

    def _exit_with_engine(self) -> None:
        code = self.proc.wait()
        if not self._stopping:
            print(f"engine {self.name} (pid {self.proc.pid}) exited with {code}: the actor exits so Ray "
                  "restarts it", file=sys.stderr, flush=True)
            os._exit(1)  # an unexpected exit, which Ray answers with a restart (not ray.actor.exit_actor)

    def info(self) -> dict:
        return {"name": self.name, "url": f"http://{self.host}:{self.port}", "pid": self.proc.pid,
                "actor_pid": os.getpid(), "node_id": self.node_id, "restarted": self.restarted,
                "running": self.proc.poll() is None}

    def stop(self, timeout: float = 20.0) -> int | None:
        self._stopping = True
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
