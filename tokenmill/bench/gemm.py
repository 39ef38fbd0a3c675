"""Library GEMMs at decode/prefill batch sizes: F.linear vs oneDNN (our no-compiler fallback,
models/linear.py) vs NumPy/OpenBLAS, over 30 distinct weights so they come from memory. Our own
panel GEMM against oneDNN: `python -m tokenmill.bench.kernels`.

    python -m tokenmill.bench.gemm [--threads 2]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F


def time_call(fn, repeats: int = 5) -> float:
    """Seconds per call of fn, after one warm-up call."""
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--in-features", type=int, default=576)
    p.add_argument("--out-features", type=int, default=3072)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    layers = 30
    weights = [torch.randn(args.out_features, args.in_features) for _ in range(layers)]
    transposed = [w.t().contiguous().numpy() for w in weights]
    print(f"threads={torch.get_num_threads()} weight {args.out_features}x{args.in_features} x {layers} (fp32)")
    print(f"{'M':>5} {'F.linear':>16} {'oneDNN':>16} {'numpy':>16}   GFLOP/s")
    for m in (1, 8, 32, 64, 128, 512):
        x = torch.randn(m, args.in_features)
        flops = 2 * m * args.in_features * args.out_features * layers
        kernels = [lambda: [F.linear(x, w) for w in weights],
                   lambda: [torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w in weights],
                   lambda: [x.numpy() @ w for w in transposed]]
        cells = [f"{flops / time_call(k) / 1e9:16.1f}" for k in kernels]
        print(f"{m:>5} {' '.join(cells)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
