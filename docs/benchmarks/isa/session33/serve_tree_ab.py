"""`tokenmill serve` from two checkouts, alternated: one `tokenmill bench serve` workload and rate per server
start; prints TTFT/TPOT p50/p99 and output tok/s of each run (for a change the offline A/B cannot see).
The servers run as compare_vllm_serve.py runs ours: the default model's float weights (--quantization none,
dtype auto), max_model_len 8192, prompts measured with its tokenizer, seed 0.
    python docs/benchmarks/isa/session33/serve_tree_ab.py --a /tmp/base --b . --workload chat --rate 2 [--rounds 2]
    [--env-b KEY=VALUE] (e.g. TOKENMILL_NATIVE_DECODE=0, to compare one tree with itself)
    [--quantization gguf] (session 35: the default model as shipped, its GGUF Q4_1 blocks; no --model flag)"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tokenmill.models.default_model import resolve_default_model

FOLDER = str(resolve_default_model())


def wait_ready(url: str, proc: subprocess.Popen) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("server not ready")


def one(tree: str, env_extra: dict, workload: str, rate: float, n: int, port: int, quantization: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), **env_extra}
    url = f"http://127.0.0.1:{port}"
    out = Path(tempfile.mkdtemp())
    with open(out / "server.log", "w") as log:
        weights = [] if quantization == "gguf" else ["--model", FOLDER, "--quantization", quantization]
        proc = subprocess.Popen([sys.executable, "-m", "tokenmill", "serve", *weights, "--port", str(port),
                                 "--dtype", "auto", "--max-model-len", "8192",
                                 "--disable-log-stats"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tree)
        try:
            wait_ready(url, proc)
            subprocess.run([sys.executable, "-m", "tokenmill", "bench", "serve", "--base-url", url, "--workload",
                            workload, "--request-rate", str(rate), "--num-requests", str(n), "--out", str(out / "b"),
                            "--tokenizer", FOLDER, "--seed", "0", "--disable-tqdm"], env=env, cwd=tree, check=True, capture_output=True)
        finally:
            proc.terminate()
            proc.wait(30)
    return json.loads(next((out / "b").rglob("results.json")).read_text())["summary"]


def pick(s: dict) -> str:
    return (f"TTFT p50/p99 {s['ttft_ms']['p50']:.0f}/{s['ttft_ms']['p99']:.0f} ms, TPOT p50/p99 "
            f"{s['tpot_ms']['p50']:.1f}/{s['tpot_ms']['p99']:.1f} ms, output {s['output_throughput']:.1f} tok/s")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--a", required=True)
    p.add_argument("--b", required=True)
    p.add_argument("--env-b", action="append", default=[])
    p.add_argument("--workload", default="chat")
    p.add_argument("--rate", type=float, default=2.0)
    p.add_argument("--num-requests", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quantization", default="none")
    a = p.parse_args()
    env_b = dict(kv.split("=", 1) for kv in a.env_b)
    for r in range(a.rounds):
        for name in (("a", "b") if r % 2 == 0 else ("b", "a")):
            tree, env = (a.a, {}) if name == "a" else (a.b, env_b)
            rep = one(tree, env, a.workload, a.rate, a.num_requests, 8200 + r, a.quantization)
            print(f"round {r + 1} {name}: {pick(rep)}", flush=True)


if __name__ == "__main__":
    main()
