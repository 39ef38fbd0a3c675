"""`tokenmill serve` scheduler variants on one workload and rate, one server after another, alternated.

    python docs/benchmarks/isa/session31/sched_variants.py --workload long-short-mix --rate 1 --rounds 2 \
        --variant="" --variant="--no-one-prompt-end-per-step" --variant="--max-num-batched-tokens 2048" \
        --out docs/benchmarks/isa/session31/sched_variants

Servers as `benchmarks/compare_vllm_serve.py` starts ours (dtype bfloat16, weights unquantized, the
model's 8192 context); the client is `tokenmill.bench.serve` with that script's flags. Prints TTFT
p50/p99, TPOT p50/p99 and output tok/s per variant and round.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from benchmarks.compare_vllm_serve import bench, stop, wait_ready  # noqa: E402
from tokenmill.models.default_model import resolve_default_model  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default="long-short-mix")
    p.add_argument("--rate", default="1")
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variant", action="append", default=[])
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    folder = str(resolve_default_model())
    base = [sys.executable, "-m", "tokenmill.cli", "serve", "--model", folder, "--port", "8011", "--dtype", "bfloat16",
            "--max-model-len", "8192", "--disable-log-stats", "--quantization", "none"]
    rows = []
    for r in range(a.rounds):
        order = a.variant if r % 2 == 0 else a.variant[::-1]
        for flags in order:
            name = f"v{a.variant.index(flags)}_r{r + 1}"
            out = a.out / name
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "server.log", "w") as f:
                proc = subprocess.Popen(base + shlex.split(flags), stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
                try:
                    wait_ready("http://127.0.0.1:8011", proc, 300)
                    bench("http://127.0.0.1:8011", a.workload, a.rate, a.num_requests, folder, out)
                finally:
                    stop(proc)
            s = json.loads((out / "results.json").read_text())["summary"]  # one rate: no sweep.json
            row = {"variant": flags or "(default)", "round": r + 1,
                   "ttft_p50_ms": round(s["ttft_ms"]["p50"]), "ttft_p99_ms": round(s["ttft_ms"]["p99"]),
                   "tpot_p50_ms": round(s["tpot_ms"]["p50"], 1), "tpot_p99_ms": round(s["tpot_ms"]["p99"], 1),
                   "output_tok_s": round(s["output_throughput"], 1), "completed": s["completed"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    (a.out / "summary.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
