"""End-to-end: `bench serve` against the fake streaming server (see conftest.py)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tokenmill.bench.serve import main

FakeServer = Any  # the fixture's type, defined in conftest.py


def bench(server: FakeServer, out: Path, *extra: str) -> int:
    return main(["serve", "--base-url", server.url, "--out", str(out), "--disable-tqdm", *extra])


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_run_writes_results_report_and_plots(fake_server: FakeServer, tmp_path: Path) -> None:
    fake_server.state.fail_on = {3}
    out = tmp_path / "run"
    rc = bench(fake_server, out, "--workload", "random", "--input-len", "16", "--output-len", "6",
               "--num-requests", "12", "--request-rate", "100", "--max-concurrency", "4",
               "--slo-ttft-ms", "5000", "--slo-tpot-ms", "5000", "--price-per-hour", "2.5")
    assert rc == 0
    assert (out / "report.md").read_text().startswith("# tokenmill bench serve")
    assert (out / "latency_cdf.png").stat().st_size > 1000
    data = load(out / "results.json")
    s, reqs, meta = data["summary"], data["requests"], data["meta"]

    assert meta["model"] == "fake-model" and meta["request_rate"] == 100 and meta["date"]
    assert (s["completed"], s["failed"], s["sent"]) == (11, 1, 12)
    assert len(reqs) == 12
    bad = [r for r in reqs if not r["success"]]
    assert len(bad) == 1 and bad[0]["status_code"] == 500 and "injected failure" in bad[0]["error"]
    assert list(s["errors"].values()) == [1]

    body = fake_server.state.bodies[0]
    assert body["stream"] is True and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}

    for r in (r for r in reqs if r["success"]):
        assert r["usage_reported"]
        assert r["output_tokens"] == r["max_tokens"]  # from usage, not from the chunk count
        assert r["num_chunks"] == math.ceil(r["max_tokens"] / 2)
        assert r["prompt_tokens"] == r["input_len"]
        assert r["ttft_s"] >= fake_server.prefill_s and r["e2e_s"] >= r["ttft_s"]
        assert len(r["itl_s"]) == r["num_chunks"] - 1
        assert 0 <= sum(r["itl_s"]) <= r["e2e_s"] - r["ttft_s"]
        assert r["tpot_s"] == pytest.approx((r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1))

    assert s["usage_missing"] == 0
    assert s["total_output_tokens"] == sum(r["output_tokens"] for r in reqs if r["success"])
    assert s["output_throughput"] == pytest.approx(s["total_output_tokens"] / s["duration_s"])
    assert 0 < s["duration_s"] < 30
    assert fake_server.prefill_s * 1000 <= s["ttft_ms"]["p50"] <= s["ttft_ms"]["p99"] <= s["e2e_ms"]["p99"]
    assert s["goodput"]["good_requests"] == 11
    assert s["goodput"]["attainment_pct"] == pytest.approx(100 * 11 / 12)
    assert s["cost"]["total"] == pytest.approx(s["duration_s"] / 3600 * 2.5)
    assert s["server"]["mean_queue_time_ms"] == pytest.approx(fake_server.queue_s * 1000)
    assert s["server"]["prefix_cache_hit_rate"] == pytest.approx(0.5)
    assert "Goodput" in (out / "report.md").read_text()


def test_sweep_chat_and_compare(fake_server: FakeServer, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "sweep"
    rc = bench(fake_server, out, "--endpoint", "chat", "--workload", "chat", "--input-len", "20",
               "--output-len", "4", "--num-requests", "6", "--sweep", "50,inf", "--burstiness", "2",
               "--no-ignore-eos", "--model", "fake-model")
    assert rc == 0
    assert all("ignore_eos" not in b and "messages" in b for b in fake_server.state.bodies)
    prompts = [b["messages"][0]["content"] for b in fake_server.state.bodies]
    assert not set(prompts[:6]) & set(prompts[6:])  # new text for each rate: no prefix-cache carry-over
    for name in ("sweep.json", "report.md", "latency_cdf.png", "sweep_throughput.png",
                 "sweep_p99_latency.png", "rate_50/results.json", "rate_inf/report.md"):
        assert (out / name).exists(), name
    runs = load(out / "sweep.json")["runs"]
    assert [r["request_rate"] for r in runs] == [50.0, "inf"]
    for run in runs:
        assert run["summary"]["completed"] == 6 and run["summary"]["failed"] == 0
        assert run["summary"]["ttft_ms"]["mean"] >= fake_server.prefill_s * 1000  # role-only chunk not a token

    capsys.readouterr()
    assert main(["compare", str(out), str(out / "rate_50")]) == 0  # sweep vs single: rate 50 pairs up
    text = capsys.readouterr().out
    assert "| Metric | Unit | A | B | B/A |" in text and "1.000" in text
    assert main(["compare", str(out), str(out)]) == 0
    assert "## rate inf" in capsys.readouterr().out


def test_without_usage_counts_chunks_and_flags(fake_server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "nousage"
    rc = bench(fake_server, out, "--input-len", "8", "--output-len", "6", "--num-requests", "3",
               "--extra-body", '{"fake_no_usage": true}', "--max-concurrency", "2")
    assert rc == 0
    data = load(out / "results.json")
    assert data["summary"]["usage_missing"] == 3
    assert all(not r["usage_reported"] and r["output_tokens"] == r["num_chunks"] for r in data["requests"])
    assert "without server usage" in (out / "report.md").read_text()


def test_all_failed_exits_nonzero(fake_server: FakeServer, tmp_path: Path) -> None:
    fake_server.state.fail_on = {1, 2}
    rc = bench(fake_server, tmp_path / "f", "--input-len", "4", "--output-len", "2", "--num-requests", "2")
    assert rc == 1
    assert load(tmp_path / "f" / "results.json")["summary"]["failed"] == 2


def test_ctrl_c_writes_partial_results(fake_server: FakeServer, tmp_path: Path) -> None:
    fake_server.state.chunk_gap_s = 0.2  # each request streams for ~1 s
    out = tmp_path / "partial"
    repo = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "tokenmill.bench.serve", "--base-url", fake_server.url,
           "--out", str(out), "--disable-tqdm", "--input-len", "4", "--output-len", "10",
           "--num-requests", "40", "--request-rate", "10"]
    env = {**os.environ, "PYTHONPATH": str(repo) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # A child started from a background job inherits SIGINT ignored (then Python installs no
    # KeyboardInterrupt handler); restore the default so Ctrl-C is what the bench sees.
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while fake_server.state.count < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    data = load(out / "results.json")
    assert data["meta"]["interrupted"] is True
    s = data["summary"]
    assert s["interrupted"] >= 1 and s["not_sent"] >= 1
    assert s["sent"] + s["not_sent"] == 40
    assert (out / "report.md").read_text().startswith("# tokenmill bench serve (interrupted)")


def test_timeouts_are_recorded_as_failures(fake_server: FakeServer, tmp_path: Path) -> None:
    fake_server.state.chunk_gap_s = 0.5  # longer than the read timeout between chunks
    out = tmp_path / "timeout"
    rc = bench(fake_server, out, "--input-len", "4", "--output-len", "6", "--num-requests", "2",
               "--timeout", "0.2")
    assert rc == 1
    s = load(out / "results.json")["summary"]
    assert s["failed"] == 2 and s["errors"] == {"timeout: ReadTimeout": 2}
