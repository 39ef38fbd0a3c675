"""Step times with the C++ layer stack off, on pure decode steps only, and on every step
(TOKENMILL_NATIVE_STACK=0 / decode / 1), each variant in a fresh process, alternated: decode steps of B
sequences with 256-token contexts (roofline.measure_decode) and a prefill of 4 x 256 prompt tokens
(roofline.measure_prefill, model forward seconds).
    python docs/benchmarks/isa/session34/native_stack_ab.py [--rounds 2] [--batches 1,8] [--dtype auto]
        [--quantization none|gguf] [--variants 0,decode,1]"""
import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, sys
from tokenmill import LLM
from tokenmill.bench.roofline import measure_decode, measure_prefill
llm = LLM(dtype=sys.argv[1], quantization=sys.argv[3], max_num_batched_tokens=1024, enable_prefix_caching=False)
res = {}
for b in map(int, sys.argv[2].split(",")):
    measure_decode(llm, batch=b, steps=4)  # warm-up
    res[f"decode B={b}"] = min(measure_decode(llm, batch=b, steps=16)["step_s"] for _ in range(3))
measure_prefill(llm)
res["prefill 4x256"] = min(measure_prefill(llm)["seconds"] for _ in range(3))
print("RESULT", json.dumps(res))
"""


def run(variant: str, a) -> dict:
    env = {**os.environ, "TOKENMILL_NATIVE_STACK": variant}
    out = subprocess.run([sys.executable, "-c", CHILD, a.dtype, a.batches, a.quantization], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.split("RESULT", 1)[1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batches", default="1,8")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", default="none")
    p.add_argument("--variants", default="0,decode,1")
    a = p.parse_args()
    variants = a.variants.split(",")
    for r in range(a.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        res = {v: run(v, a) for v in order}
        base = res[variants[0]]
        for key in base:
            cells = ", ".join(f"{v}: {res[v][key] * 1e3:.2f} ms ({base[key] / res[v][key]:.3f}x)" for v in variants)
            print(f"round {r + 1} (first {order[0]}) {key}: {cells}", flush=True)


if __name__ == "__main__":
    main()
