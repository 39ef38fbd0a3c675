"""Markdown table of a compare_vllm_serve.py output folder: per workload and rate, TTFT/TPOT p50/p99 and
goodput, ours / vLLM, with the TTFT p99 ratio.

    python docs/benchmarks/isa/session25/serve_table.py OUT_FOLDER
"""
import json
import sys
from pathlib import Path


def summaries(folder: Path) -> dict:
    d = json.loads((folder / "sweep.json").read_text())
    return {r["request_rate"]: r["summary"] for r in d["runs"]}


def main() -> None:
    out = Path(sys.argv[1])
    for w in sorted(p.name for p in (out / "tokenmill").iterdir() if p.is_dir()):
        a, b = summaries(out / "tokenmill" / w), summaries(out / "vllm" / w)
        print(f"\n{w}\n")
        print("| rate | done ours / vLLM | TTFT p50 ours / vLLM (ms) | TTFT p99 ours / vLLM | ratio | TPOT p50 ours / vLLM "
              "| TPOT p99 ours / vLLM | output tok/s ours / vLLM | goodput ours / vLLM (req/s) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for rate in sorted(a):
            x, y = a[rate], b[rate]
            def g(s, k, q):
                return s[k][q]
            print(f"| {rate:g} | {x['completed']} / {y['completed']} "
                  f"| {g(x, 'ttft_ms', 'p50'):.0f} / {g(y, 'ttft_ms', 'p50'):.0f} "
                  f"| {g(x, 'ttft_ms', 'p99'):.0f} / {g(y, 'ttft_ms', 'p99'):.0f} "
                  f"| **{g(x, 'ttft_ms', 'p99') / g(y, 'ttft_ms', 'p99'):.2f}** "
                  f"| {g(x, 'tpot_ms', 'p50'):.1f} / {g(y, 'tpot_ms', 'p50'):.1f} "
                  f"| {g(x, 'tpot_ms', 'p99'):.1f} / {g(y, 'tpot_ms', 'p99'):.1f} "
                  f"| {x['output_throughput']:.1f} / {y['output_throughput']:.1f} "
                  f"| {x['goodput']['requests_per_s']:.2f} / {y['goodput']['requests_per_s']:.2f} |")


if __name__ == "__main__":
    main()
