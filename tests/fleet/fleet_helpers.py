"""Starting a live `tokenmill fleet` for tests (a module of its own: `conftest` names collide
between test folders)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from e2e_helpers import end_process, free_port  # noqa: E402

TENANTS = {"acme": ("KEY_A", "interactive"), "initech": ("KEY_I", "standard"), "globex": ("KEY_G", "batch")}


@dataclass
class Fleet:
    url: str
    ledger: Path
    proc: subprocess.Popen
    log: Path

    def key(self, tenant: str) -> str:
        return TENANTS[tenant][0]

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text

    def data(self) -> dict:
        return httpx.get(self.url + "/dashboard/data", timeout=10).json()


def run_fleet(config: dict, tmp: Path):
    """Start `tokenmill fleet` on `config`, yield a Fleet once /health is 200, stop it after."""
    ledger_path = Path(config["ledger"])
    cfg = tmp / "fleet.yaml"
    cfg.write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp / "fleet.log"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tokenmill", "fleet", "--config", str(cfg), "--host",
                                 "127.0.0.1", "--port", str(port), "--log-dir", str(tmp / "replicas")],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fleet exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"fleet not healthy:\n{log.read_text()[-4000:]}")
            time.sleep(0.3)
        yield Fleet(url, ledger_path, proc, log)
    finally:
        end_process(proc)
