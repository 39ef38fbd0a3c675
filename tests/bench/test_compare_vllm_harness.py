"""benchmarks/compare_vllm.py stops the idle vLLM peer while ours runs, and always continues it."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[2])
if REPO not in sys.path:  # benchmarks/ is a folder of scripts, imported as compare_vllm_serve.py does
    sys.path.insert(0, REPO)
from benchmarks.compare_vllm import Peer


def states(pgid: int) -> set[str]:
    """Process states (R, S, T, ...) of the group's members."""
    out = subprocess.run(["ps", "-o", "stat=", "-g", str(pgid)], capture_output=True, text=True,
                         check=False).stdout  # ps exits 1 when the group is gone
    return {line.strip()[0] for line in out.splitlines() if line.strip()}


def wait_for(pgid: int, want: set[str]) -> set[str]:
    deadline = time.monotonic() + 10
    while (got := states(pgid)) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


@pytest.fixture
def fake_peer():
    peer = Peer.__new__(Peer)  # a session leader with a child, as peer_vllm.py and vLLM's engine process
    peer.proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60; wait"], start_new_session=True)
    yield peer
    peer.proc.kill()
    subprocess.run(["pkill", "-KILL", "-g", str(peer.proc.pid)], check=False)
    peer.proc.wait()


def test_paused_stops_the_whole_group_and_continues_it(fake_peer):
    pgid = fake_peer.proc.pid
    assert wait_for(pgid, {"S"}) == {"S"}
    with fake_peer.paused():
        assert wait_for(pgid, {"T"}) == {"T"}
    assert wait_for(pgid, {"S"}) == {"S"}
    with pytest.raises(RuntimeError), fake_peer.paused():  # an error in our run still continues the peer
        raise RuntimeError
    assert wait_for(pgid, {"S"}) == {"S"}
    with fake_peer.paused(enabled=False):
        assert states(pgid) == {"S"}
