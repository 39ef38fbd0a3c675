"""The headline (goodput and cost) against the fake server (conftest.py): default SLOs marked as
such, flags winning over them, a clear "cost not computed" where the server exports no price, and
the endpoint each workload defaults to."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tokenmill.bench.serve import main
from tokenmill.bench.slos import DEFAULT_SLOS

FakeServer = Any  # the fixture's type, defined in conftest.py
NO_COST = "cost not computed: pass --price-per-hour"


def bench(server: FakeServer, out: Path, *extra: str) -> int:
    return main(["serve", "--base-url", server.url, "--out", str(out), "--disable-tqdm",
                 "--input-len", "8", "--output-len", "4", "--num-requests", "3", *extra])


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_defaults_marked_and_cost_not_computed(fake_server: FakeServer, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "run"
    assert bench(fake_server, out, "--workload", "chat") == 0
    console = capsys.readouterr().out
    data = load(out / "results.json")
    meta, s = data["meta"], data["summary"]
    report = (out / "report.md").read_text()

    # what was measured against is printed before the run starts
    assert console.splitlines()[0] == f"model: fake-model at {fake_server.url}/v1/chat/completions " \
                                      "(default for --workload chat)"
    slo_text = "TTFT <= 2000 ms (default for chat), TPOT <= 200 ms (default for chat), no E2E SLO"
    assert console.splitlines()[1] == f"SLOs: {slo_text}"
    assert console.splitlines()[2].startswith(f"price: {NO_COST} (")
    # the same in results.json and report.md
    assert meta["slo"] == DEFAULT_SLOS["chat"].values()
    assert meta["slo_source"] == {"ttft_ms": "default", "tpot_ms": "default"}
    assert s["goodput"]["slo"] == meta["slo"] and s["goodput"]["slo_source"] == meta["slo_source"]
    assert s["goodput"]["good_requests"] == 3  # the fake server is well within them
    assert f"| SLOs | {slo_text} |" in report and f"- SLOs: {slo_text}" in report
    # no price: said so, never a silent None
    assert s["cost"] is None and s["cost_note"].startswith(NO_COST)
    assert "tokenmill:price_per_hour_usd" in s["cost_note"]
    assert meta["price_source"] == "none" and meta["price_per_hour"] is None
    assert f"| Cost per 1M output tokens ($) | {NO_COST} (" in report
    assert f"- Price: none, {NO_COST}" in report


def test_flags_win_over_defaults(fake_server: FakeServer, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "run"
    assert bench(fake_server, out, "--workload", "chat", "--slo-ttft-ms", "1", "--slo-tpot-ms", "off",
                 "--slo-e2e-ms", "60000", "--price-per-hour", "3.6") == 0
    console = capsys.readouterr().out
    data = load(out / "results.json")
    meta, s = data["meta"], data["summary"]
    assert meta["slo"] == {"ttft_ms": 1.0, "e2e_ms": 60000.0}
    assert meta["slo_source"] == {"ttft_ms": "flag", "e2e_ms": "flag"}
    assert s["goodput"]["good_requests"] == 0  # nothing answers within 1 ms (the fake prefill is 20 ms)
    assert "SLOs: TTFT <= 1 ms (--slo-ttft-ms), E2E <= 60000 ms (--slo-e2e-ms), no TPOT SLO" in console
    assert (meta["price_per_hour"], meta["price_source"]) == (3.6, "flag")
    assert s["cost"]["price_source"] == "flag" and "cost_note" not in s
    assert s["cost"]["per_million_output_tokens"] == pytest.approx(
        s["duration_s"] / 3600 * 3.6 / s["total_output_tokens"] * 1e6)
    assert s["cost"]["per_million_total_tokens"] == pytest.approx(
        s["duration_s"] / 3600 * 3.6 / (s["total_output_tokens"] + s["total_input_tokens"]) * 1e6)
    assert "price: $3.6/h from --price-per-hour" in console
    assert "| Cost per 1M total tokens ($) |" in (out / "report.md").read_text()


def test_every_slo_off_says_goodput_not_computed(fake_server: FakeServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert bench(fake_server, out, "--slo-ttft-ms", "off", "--slo-tpot-ms", "off") == 0
    s = load(out / "results.json")["summary"]
    assert s["goodput"] is None and "every SLO is off" in s["goodput_note"]
    assert "| Goodput (req/s) | goodput not computed: every SLO is off" in (out / "report.md").read_text()


@pytest.mark.parametrize("extra, path", [
    (["--workload", "chat"], "/v1/chat/completions"),
    (["--workload", "random"], "/v1/completions"),
    (["--workload", "chat", "--endpoint", "completions"], "/v1/completions"),
    (["--workload", "random", "--endpoint", "chat"], "/v1/chat/completions"),
])
def test_endpoint_defaults_to_chat_for_the_chat_workload(fake_server: FakeServer, tmp_path: Path,
                                                          extra: list[str], path: str) -> None:
    out = tmp_path / "run"
    assert bench(fake_server, out, *extra) == 0
    assert fake_server.state.paths == [path] * 3
    chat = path == "/v1/chat/completions"
    for body in fake_server.state.bodies:
        assert ("messages" in body, "prompt" in body) == (chat, not chat)
        if chat:
            assert body["messages"] == [{"role": "user", "content": body["messages"][0]["content"]}]
    data = load(out / "results.json")
    assert data["meta"]["endpoint"] == ("chat" if chat else "completions")
    assert data["meta"]["endpoint_source"] == ("flag" if "--endpoint" in extra else "default")
    for r in data["requests"]:  # tokens from usage; the chat role-only chunk is not a token
        assert r["success"] and r["output_tokens"] == r["max_tokens"]
        assert r["num_chunks"] == math.ceil(r["max_tokens"] / 2)
        assert r["ttft_s"] >= fake_server.prefill_s


def test_sweep_without_price_skips_the_cost_plot(fake_server: FakeServer, tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "sweep"
    assert bench(fake_server, out, "--sweep", "100,inf") == 0
    console = capsys.readouterr().out
    assert not (out / "sweep_cost.png").exists()
    assert (out / "sweep_p99_latency.png").is_file()
    report = (out / "report.md").read_text()
    assert "`sweep_cost.png` skipped: cost not computed" in report
    assert f"- {NO_COST} (" in console  # under the sweep table, which is all the console shows
    assert "- SLOs: TTFT <= 5000 ms (default for random)" in console
