"""TTFT of single requests on an idle server, by prompt length: tokenmill serve, then vllm serve.

    python docs/benchmarks/isa/session25/ttft_idle_probe.py --peer-venv /opt/vllm-venv [--lengths 128,256,512,1024,1900]
        [--max-model-len 8192 --peer-dtype float32]   (session 31, machine D: long prompts, vLLM's fastest dtype there)

Each length: 1 warm-up then --repeats requests, one at a time, different text each, chat endpoint, streamed,
max_tokens 2, ignore_eos. TTFT = client-side time to the first content chunk. Servers as in
benchmarks/compare_vllm_serve.py (same flags and env).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
from openai import OpenAI  # noqa: E402

from benchmarks.compare_vllm import peer_env, peer_python  # noqa: E402
from benchmarks.compare_vllm_serve import stop, wait_ready  # noqa: E402
from tokenmill.bench.workloads import PromptBuilder, load_tokenizer  # noqa: E402



def model_folder() -> str:
    from tokenmill.models.default_model import resolve_default_model
    return str(resolve_default_model())


def ttft(client: OpenAI, model: str, text: str) -> float:
    t0 = time.perf_counter()
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                            max_tokens=2, stream=True, extra_body={"ignore_eos": True})
    first = None
    for chunk in stream:
        if first is None and chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason):
            first = time.perf_counter() - t0
    return first


def probe(base: str, lengths: list[int], repeats: int, seed: int) -> dict:
    client = OpenAI(base_url=base + "/v1", api_key="x")
    model = client.models.list().data[0].id
    b = PromptBuilder(load_tokenizer(model_folder()))
    rng = np.random.default_rng(seed)
    out = {}
    for n in lengths:
        ttft(client, model, b.text(n, rng))
        xs = [ttft(client, model, b.text(n, rng)) * 1e3 for _ in range(repeats)]
        out[n] = {"median_ms": statistics.median(xs), "min_ms": min(xs), "all_ms": [round(x, 1) for x in xs]}
        print(base, n, f"median {out[n]['median_ms']:.1f} ms min {out[n]['min_ms']:.1f}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer-venv", default="/opt/vllm-venv")
    ap.add_argument("--lengths", default="128,256,512,1024,1900")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", default="tokenmill,vllm")
    ap.add_argument("--tokenmill-extra", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--max-model-len", default="2048")
    ap.add_argument("--peer-dtype", default="bfloat16")
    a = ap.parse_args()
    MODEL = model_folder()
    lengths = [int(x) for x in a.lengths.split(",")]
    res = {}
    servers = {
        "tokenmill": ([sys.executable, "-m", "tokenmill.cli", "serve", "--model", MODEL, "--port", "8011", "--dtype",
                       "bfloat16", "--max-model-len", a.max_model_len, "--disable-log-stats", "--quantization", "none"]
                      + a.tokenmill_extra.split(), None, 8011),
        "vllm": ([str(peer_python(a.peer_venv)), "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL,
                  "--port", "8012", "--dtype", a.peer_dtype, "--max-model-len", a.max_model_len, "--seed", "0",
                  "--disable-log-stats"], peer_env(a.peer_venv, 4, True), 8012),
    }
    for name in a.only.split(","):
        cmd, env, port = servers[name]
        base = f"http://127.0.0.1:{port}"
        with open(f"/tmp/ttft_probe_{name}.log", "w") as f:
            proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
            try:
                wait_ready(base, proc, 600)
                res[name] = probe(base, lengths, a.repeats, 0)
            finally:
                stop(proc)
    if "tokenmill" in res and "vllm" in res:
        for n in lengths:
            print(n, f"ours/vllm median {res['tokenmill'][n]['median_ms'] / res['vllm'][n]['median_ms']:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
