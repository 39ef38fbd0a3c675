"""`tokenmill sim` and `tokenmill plan` end to end (in process, small workloads)."""
import json

import pytest

from tokenmill.bench.compare import compare_runs
from tokenmill.cli import main

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
         "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256}


def test_sim_writes_bench_results_that_compare_reads(tmp_path, capsys):
    common = ["--workload", "chat", "--num-requests", "20", "--request-rate", "2", "--workload-opt", "input_len=64",
              "--workload-opt", "output_len=8", "--disable-tqdm"]
    assert main(["sim", *common, "--out", str(tmp_path / "a")]) == 0
    assert main(["sim", "run", *common, "--replicas", "2", "--out", str(tmp_path / "b")]) == 0
    data = json.loads((tmp_path / "a" / "results.json").read_text())
    assert data["summary"]["completed"] == 20 and data["meta"]["simulated"].startswith("profile measured on")
    assert len(data["requests"]) == 20 and all(r["ttft_s"] > 0 for r in data["requests"])
    assert (tmp_path / "a" / "report.md").read_text().startswith("# tokenmill sim (simulated)")
    table = compare_runs(str(tmp_path / "a"), str(tmp_path / "b"))
    assert "ttft_ms.p99" in table


def test_sim_replays_a_trace_with_prefix_groups(tmp_path):
    trace = tmp_path / "trace.jsonl"
    lines = [{"timestamp": 0.5 * i, "input_len": 80, "output_len": 4, "prefix_group": "sys" if i % 2 else 7,
              "prefix_len": 64} for i in range(10)]
    trace.write_text("\n".join(json.dumps(x) for x in lines))
    assert main(["sim", "--workload", str(trace), "--out", str(tmp_path / "t"), "--disable-tqdm"]) == 0
    summary = json.loads((tmp_path / "t" / "results.json").read_text())["summary"]
    # two groups of five: each group's first request misses, the other four hit 64 tokens (4 blocks)
    assert summary["server"]["prefix_cache_hit_rate"] == pytest.approx(8 * 64 / (10 * 80))


def test_sim_rejects_bad_flags(tmp_path, capsys):
    assert main(["sim", "--hardware", "h300", "--out", str(tmp_path)]) == 2
    assert "unknown device 'h300'" in capsys.readouterr().err
    assert main(["sim", "--max-concurrency", "4", "--out", str(tmp_path)]) == 2
    assert "--max-concurrency" in capsys.readouterr().err


def test_plan_writes_a_report_with_plots(tmp_path, capsys):
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA))
    out = tmp_path / "plan"
    assert main(["plan", "--model", str(model), "--workload", "chat", "--num-requests", "60", "--request-rate", "10",
                 "--slo", "ttft_p99<=2s,tpot_p99<=100ms", "--hardware", "h100", "--tp", "1",
                 "--batch-tokens", "2048", "--weight-dtypes", "bfloat16", "--kv-dtypes", "bfloat16",
                 "--pd-ratios", "none", "--out", str(out), "--disable-tqdm"]) == 0
    report = (out / "plan.md").read_text()
    assert "h100 1x TP1" in report and "continuous batching off" in report and "2-per-device" in report
    plan = json.loads((out / "plan.json").read_text())
    assert plan["best"][0]["ttft_ms.p99"] <= 2000 and plan["best"][0]["tpot_ms.p99"] <= 100
    assert plan["best"][0]["binding"] in ("compute", "HBM bandwidth", "KV capacity", "queueing", "communication",
                                          "step overhead")
    assert (out / "frontier.png").stat().st_size > 0 and (out / "latency.png").stat().st_size > 0
    assert main(["plan", "--model", str(model), "--slo", "ttft<=2s", "--out", str(out)]) == 2
    assert "METRIC_pN" in capsys.readouterr().err


def test_validation_error_table():
    from tokenmill.sim.validate import error_table

    def summary(ttft50, tput):
        return {"ttft_ms": {"p50": ttft50, "p99": 2 * ttft50}, "tpot_ms": {"p50": 10.0, "p99": 20.0},
                "output_throughput": tput}
    cases = [("chat", 0.5, summary(100.0, 10.0), summary(110.0, 10.0), (1.0, 1.5)),
             ("chat", 1.0, summary(100.0, 10.0), summary(70.0, 12.0))]
    table = error_table(cases)
    assert "100.0 / 110.0 (+10%)" in table and "100.0 / 70.0 (-30%)" in table and "1.0 -> 1.5" in table
    assert "| TTFT p50 | 20.0% | 30.0% |" in table and "| throughput | 10.0% | 20.0% |" in table


def test_sim_elastic_runs_the_cluster_planner(tmp_path, capsys):
    """`tokenmill sim --elastic`: short prompts only, so the planner empties the prefill pool (colocate)."""
    common = ["--workload", "random", "--input-len", "64", "--output-len", "32", "--num-requests", "60",
              "--request-rate", "4", "--disable-tqdm", "--prefill-replicas", "1", "--decode-replicas", "1"]
    assert main(["sim", *common, "--elastic", "--planner-interval", "1", "--out", str(tmp_path / "e")]) == 0
    data = json.loads((tmp_path / "e" / "results.json").read_text())
    assert data["summary"]["completed"] == 60
    moves = data["meta"]["planner_moves"]
    assert moves and moves[0]["to"] == "decode" and "colocate" in moves[0]["reason"]
    assert "planner moves" in capsys.readouterr().out
    assert main(["sim", "--elastic", "--out", str(tmp_path / "x")]) == 2
    assert "--elastic needs --prefill-replicas" in capsys.readouterr().err
