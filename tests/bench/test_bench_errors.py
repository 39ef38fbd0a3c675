"""User errors: one line on stderr naming the problem, exit code 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokenmill.bench.serve import main


def assert_one_line_error(capsys: Any, rc: int, *needles: str) -> None:
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tokenmill bench ") and "error:" in lines[0]
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0]


def test_unreachable_server(capsys: Any, unused_port: int, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{unused_port}"
    rc = main(["serve", "--base-url", url, "--num-requests", "2", "--out", str(tmp_path), "--disable-tqdm"])
    assert_one_line_error(capsys, rc, "cannot reach server", url)


def test_malformed_trace(capsys: Any, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_len": 3, "output_len": 2}) + "\n{oops\n")
    rc = main(["serve", "--workload", str(trace), "--out", str(tmp_path / "o")])
    assert_one_line_error(capsys, rc, "trace.jsonl line 2", "invalid JSON")


@pytest.mark.parametrize("args, needle", [
    (["--request-rate", "-1"], "--request-rate must be > 0"),
    (["--request-rate", "0"], "--request-rate must be > 0"),
    (["--request-rate", "nan"], "--request-rate must be > 0"),
    (["--num-requests", "0"], "--num-requests must be > 0"),
    (["--max-concurrency", "0"], "--max-concurrency must be > 0"),
    (["--burstiness", "-0.5"], "--burstiness must be >= 0"),
    (["--sweep", "1,x"], "--sweep must be comma-separated rates"),
    (["--sweep", "1,-2"], "--sweep rate must be > 0"),
    (["--slo-ttft-ms", "0"], "--slo-ttft-ms must be > 0"),
    (["--slo-e2e-ms", "fast"], "--slo-e2e-ms must be milliseconds or 'off'"),
    (["--price-per-hour", "-3"], "--price-per-hour must be >= 0"),
    (["--base-url", "localhost:8000"], "--base-url must start with http://"),
    (["--workload", "nope"], "unknown workload 'nope'"),
    (["--workload-opt", "badopt"], "--workload-opt must be KEY=VALUE"),
    (["--workload", "shared-prefix", "--input-len", "5"], "has no option 'input_len'"),
    (["--extra-body", "{"], "--extra-body is not valid JSON"),
    (["--tokenizer", "/no/such/tokenizer"], "tokenizer folder '/no/such/tokenizer' not found"),
])
def test_impossible_parameters(capsys: Any, tmp_path: Path, args: list[str], needle: str) -> None:
    rc = main(["serve", "--out", str(tmp_path), *args])
    assert_one_line_error(capsys, rc, needle)


def test_compare_missing_run(capsys: Any, tmp_path: Path) -> None:
    rc = main(["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert_one_line_error(capsys, rc, "cannot read benchmark results")
