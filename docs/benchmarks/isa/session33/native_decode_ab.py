"""Decode step time with the C++ decode stack on and off (TOKENMILL_NATIVE_DECODE=1/0), each variant in a
fresh process, alternated; batches of B sequences with 256-token contexts (roofline.measure_decode).
    python docs/benchmarks/isa/session33/native_decode_ab.py [--rounds 3] [--batches 1,8,64] [--dtype auto]"""
import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, sys
from tokenmill import LLM
from tokenmill.bench.roofline import measure_decode
llm = LLM(dtype=sys.argv[1], quantization="none", max_num_batched_tokens=1024, enable_prefix_caching=False)
res = {}
for b in map(int, sys.argv[2].split(",")):
    measure_decode(llm, batch=b, steps=4)  # warm-up
    res[b] = min(measure_decode(llm, batch=b, steps=16)["step_s"] for _ in range(3))
print("RESULT", json.dumps(res))
"""


def run(native: bool, dtype: str, batches: str) -> dict:
    env = {**os.environ, "TOKENMILL_NATIVE_DECODE": "1" if native else "0"}
    out = subprocess.run([sys.executable, "-c", CHILD, dtype, batches], env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.split("RESULT", 1)[1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--dtype", default="auto")
    a = p.parse_args()
    for r in range(a.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        res = {native: run(native, a.dtype, a.batches) for native in order}
        cells = ", ".join(f"B={b}: {res[False][b] * 1e3:.2f} -> {res[True][b] * 1e3:.2f} ms "
                          f"({res[False][b] / res[True][b]:.3f}x)" for b in res[False])
        print(f"round {r + 1} (python, native; first {'python' if not order[0] else 'native'}): {cells}", flush=True)


if __name__ == "__main__":
    main()
