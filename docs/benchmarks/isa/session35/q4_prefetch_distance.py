"""The default model's four Q4 layer shapes x 30 distinct layers at one activation row (a batch-1 decode
step's q4 GEMVs), median per call and the step's sum; run once per build of the kernel library.

    python docs/benchmarks/isa/session35/q4_prefetch_distance.py

Session 35 used it to pick the prefetch distance of the q4 row kernels: one build per distance (the
distance was then a constant in quant_avx512.cpp, now kPrefetchBytes in quant_isa.h), this script run
twice after each build. Random Q4 records as tests/test_quant_blocks.py makes them.
"""
import statistics
import sys
import time

import torch

sys.path.insert(0, "tests")
from test_quant_blocks import random_q4  # noqa: E402

from tokenmill.kernels import cpu_ops  # noqa: E402
from tokenmill.quant.blocks import pack  # noqa: E402

cpu_ops.load()
g = torch.Generator().manual_seed(0)
shapes = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
layers = {name: [pack(random_q4(n, k, g)) for _ in range(30)] for name, (n, k) in shapes.items()}
xs = {name: torch.randn(1, k) for name, (n, k) in shapes.items()}
times = {name: [] for name in shapes}
for _ in range(20):
    for layer in range(30):
        for name, (n, k) in shapes.items():
            t = time.perf_counter()
            torch.ops.tokenmill.q4_linear(xs[name], layers[name][layer], n, None)
            times[name].append(time.perf_counter() - t)
step = 0.0
for name in shapes:
    m, nbytes = statistics.median(times[name]), layers[name][0].numel()
    step += m * 30
    print(f"{name}: {m * 1e6:.1f} us, {nbytes / 1e3:.0f} KB, {nbytes / m / 1e9:.1f} GB/s")
print(f"30 layers: {step * 1e3:.2f} ms")
