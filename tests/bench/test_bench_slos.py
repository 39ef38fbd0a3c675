"""Default SLOs per workload, and flags overriding them field by field."""

from __future__ import annotations

import pytest

from tokenmill.bench.metrics import SLO
from tokenmill.bench.slos import DEFAULT_SLOS, TRACE, choose_slo, describe_slo
from tokenmill.bench.workloads import WORKLOADS, BenchError

NO_FLAGS: dict[str, str | None] = {"ttft_ms": None, "tpot_ms": None, "e2e_ms": None}


def test_every_workload_and_traces_have_default_slos() -> None:
    assert set(DEFAULT_SLOS) == set(WORKLOADS) | {TRACE}
    for name, slo in DEFAULT_SLOS.items():
        assert slo.ttft_ms and slo.tpot_ms, name  # goodput is never None by default
    assert DEFAULT_SLOS["chat"].ttft_ms < DEFAULT_SLOS["long-short-mix"].ttft_ms  # interactive is tighter


def test_defaults_are_marked_as_such() -> None:
    choice = choose_slo("chat", NO_FLAGS)
    assert choice.slo == DEFAULT_SLOS["chat"]
    assert choice.sources == {"ttft_ms": "default", "tpot_ms": "default"}
    assert choice.describe() == ("TTFT <= 2000 ms (default for chat), TPOT <= 200 ms (default for chat), "
                                 "no E2E SLO")


def test_flags_win_field_by_field() -> None:
    choice = choose_slo("chat", {"ttft_ms": "750", "tpot_ms": None, "e2e_ms": "9000"})
    assert choice.slo == SLO(ttft_ms=750, tpot_ms=DEFAULT_SLOS["chat"].tpot_ms, e2e_ms=9000)
    assert choice.sources == {"ttft_ms": "flag", "tpot_ms": "default", "e2e_ms": "flag"}
    assert "TTFT <= 750 ms (--slo-ttft-ms)" in choice.describe()
    assert "E2E <= 9000 ms (--slo-e2e-ms)" in choice.describe()


def test_off_turns_a_default_off() -> None:
    choice = choose_slo("random", {"ttft_ms": "OFF", "tpot_ms": None, "e2e_ms": None})
    assert choice.slo == SLO(tpot_ms=DEFAULT_SLOS["random"].tpot_ms)
    assert choice.sources == {"tpot_ms": "default"}
    everything_off = choose_slo("random", {"ttft_ms": "off", "tpot_ms": "off", "e2e_ms": None})
    assert not everything_off.slo.active
    summary: dict = {"goodput": None}
    everything_off.annotate(summary)
    assert summary["goodput_note"].startswith("goodput not computed: every SLO is off")


def test_a_trace_gets_the_trace_defaults(tmp_path) -> None:
    choice = choose_slo(str(tmp_path / "my_trace.jsonl"), NO_FLAGS)
    assert choice.workload == TRACE and choice.slo == DEFAULT_SLOS[TRACE]


@pytest.mark.parametrize("raw, needle", [
    ("abc", "--slo-tpot-ms must be milliseconds or 'off', got 'abc'"),
    ("0", "--slo-tpot-ms must be > 0"),
    ("-5", "--slo-tpot-ms must be > 0"),
    ("inf", "--slo-tpot-ms must be > 0 and finite"),
])
def test_bad_slo_flags_name_the_flag(raw: str, needle: str) -> None:
    with pytest.raises(BenchError, match=needle):
        choose_slo("chat", {**NO_FLAGS, "tpot_ms": raw})


def test_describe_old_results_without_sources() -> None:
    assert describe_slo({"ttft_ms": 100.0}, None, None) == "TTFT <= 100 ms, no TPOT/E2E SLO"
    assert describe_slo({}, {}, "chat") == "none"
