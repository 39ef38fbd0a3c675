"""Short versions of `python -m tokenmill.bench.reliability` (storm, overload, pressure, soak) on the
tiny model: the same code as the documented runs (docs/RELIABILITY.md), fewer requests and seconds.
Only properties are asserted, no speed: the overload run's latency bound (relative to a batch timed
in the same run) is reported, not asserted, since a shared CI machine can stall any one request."""
from __future__ import annotations

import pytest

from tokenmill.bench.reliability import run

SERVER = ["--dtype", "float32", "--num-threads", "1"]


@pytest.fixture
def tiny(tiny_llama) -> str:
    return str(tiny_llama)


def _assert_ok(row, ignore: tuple[str, ...] = ()) -> None:
    failures = [f for f in row.failures if not f.startswith(ignore)]
    assert not failures, (failures, row)


def test_disconnect_storm(tiny, tmp_path):
    row = run("storm", tiny, [*SERVER, "--kv-cache-memory-gb", "0.02"], tmp_path, requests=60, concurrency=30,
              max_tokens=12, seed=1)
    _assert_ok(row)
    assert row.dropped > 0 and row.completed > 0 and row.completed + row.dropped == 60
    assert row.leaked_blocks == 0 and row.recovery_s is not None


@pytest.mark.parametrize("arrivals", ["open", "hammer"])
def test_overload_sheds_and_recovers(tiny, tmp_path, arrivals):
    row = run("overload", tiny, [*SERVER, "--kv-cache-memory-gb", "0.02"], tmp_path, duration=4.0, max_num_seqs=2,
              max_waiting=4, max_tokens=8, arrivals=arrivals, seed=3)
    _assert_ok(row, ignore=("admitted latency",))
    assert row.shed > 0 and row.completed > 0 and row.server_errors == 0
    assert row.notes["max_waiting_seen"] <= 4


def test_memory_pressure_preempts_and_matches(tiny, tmp_path):
    row = run("pressure", tiny, SERVER, tmp_path, requests=12, max_tokens=24, stall_s=60.0)
    _assert_ok(row)
    assert row.notes["preemptions"] > 0 and row.completed == 12


def test_short_soak(tiny, tmp_path):
    row = run("soak", tiny, [*SERVER, "--kv-cache-memory-gb", "0.02"], tmp_path, duration=8.0, sample_interval=2.0,
              concurrency=6, max_tokens=8, seed=2)
    _assert_ok(row)
    assert len(row.notes["samples"]) >= 4 and row.completed > 0 and row.dropped > 0
