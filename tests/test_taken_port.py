"""A server whose --port is taken says so in one line and stops before it starts anything else: the
listening socket is bound first (tokenmill/server/listen.py). Before, `tokenmill fleet` and
`tokenmill cluster` started their replicas / engines on kernel-chosen free ports and bound their own
port last, so a child could take it first (seen in the suite: a fleet on an ephemeral --port whose
economy replica got that same port; the fleet then failed with "address already in use")."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tokenmill.server.listen import listen_socket

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def taken_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_listen_socket_names_the_flag_and_holds_the_port(taken_port):
    with pytest.raises(OSError, match=f"--port {taken_port}: cannot listen on 127.0.0.1:{taken_port}: "
                                      "Address already in use"):
        listen_socket("127.0.0.1", taken_port)
    sock = listen_socket("127.0.0.1", 0)
    try:
        port = sock.getsockname()[1]
        assert not sock.get_inheritable()  # replicas and engines started after it do not hold it
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # held from bind on, before uvicorn listens on it
    finally:
        sock.close()


def _fleet_yaml(tmp_path: Path, model: Path) -> Path:
    config = {"pools": [{"name": "p", "model": "tiny", "path": str(model),
                         "hardware": {"name": "cpu", "price_per_hour": 1.0}, "engine": {"dtype": "float32"}}],
              "slo_classes": {"batch": {}}, "tenants": {"t": {"api_key": "K", "slo_class": "batch"}},
              "ledger": str(tmp_path / "ledger.sqlite")}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_taken_port_fails_before_anything_starts(taken_port, tiny_llama, tmp_path):
    argv = {"serve": ["serve", str(tiny_llama), "--dtype", "float32"],
            "serve-multi": ["serve-multi", "--model", f"a={tiny_llama} --dtype float32"],
            "fleet": ["fleet", "--config", str(_fleet_yaml(tmp_path, tiny_llama)), "--log-dir", str(tmp_path / "logs")],
            "cluster": ["cluster", "--engines", "2", "--prefill", "1", "--model", str(tiny_llama), "--no-planner",
                        "--log-dir", str(tmp_path / "logs")]}
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = {name: subprocess.Popen([sys.executable, "-m", "tokenmill", *args, "--port", str(taken_port)],
                                    cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, args in argv.items()}  # all four at once: each is mostly Python's start-up
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        out = stdout + stderr
        assert proc.returncode == (3 if name.startswith("serve") else 2), (name, out)
        assert f"--port {taken_port}: cannot listen on 127.0.0.1:{taken_port}: Address already in use" in stderr, name
        assert "Traceback" not in out, (name, out)
        # nothing was started: no replica or engine process, no model load
        assert "replica" not in out and "engine 0" not in out and "Application startup" not in out, (name, out)
    assert not any((tmp_path / "logs").glob("*")), list((tmp_path / "logs").glob("*"))
