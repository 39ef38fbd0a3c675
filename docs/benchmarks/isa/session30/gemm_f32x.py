"""bf16 widening GEMMs (float32 x) at W1 row counts vs torch float32 F.linear (MKL) on the same shapes, 2 threads:
GFLOP/s, ours/MKL. `python gemm_f32x.py` (W1's decode and mixed steps) or `python gemm_f32x.py small` (1-24 rows) or `python gemm_f32x.py head` (qkv and the LM head only)."""
import sys, torch, time
import torch.nn.functional as F
from tokenmill.kernels import cpu_ops
cpu_ops.load()
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
def best_of(f, flops):
    for _ in range(3): f()
    reps = max(3, int(2e9 / flops)); best = 9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps): f()
        best = min(best, (time.perf_counter() - t) / reps)
    return best
a = torch.randn(2048, 2048); b = torch.randn(2048, 2048)
print(f"torch 2048^3 f32 matmul: {2 * 2048**3 / best_of(lambda: a @ b, 2 * 2048**3) / 1e9:.0f} GFLOP/s")
ROWS = (1, 2, 4, 6, 8, 12, 24) if sys.argv[1:] == ["small"] else (16, 52, 100, 128, 512)
HEAD_ONLY = sys.argv[1:] == ["head"]
for m in ROWS:
    row = []
    shapes = [(960, 576, "qkv"), (576, 576, "o"), (3072, 576, "swiglu"), (576, 1536, "down"), (49152, 576, "head")]
    for (n, k, what) in [sh for sh in shapes if not HEAD_ONLY or sh[2] in ("qkv", "head")]:
        w = torch.randn(n, k, generator=g); x = torch.randn(m, k, generator=g)
        p = torch.ops.tokenmill.pack_bf16_panels(w.bfloat16())
        flops = 2 * m * n * k
        if what == "swiglu":
            f = lambda: torch.ops.tokenmill.bf16_swiglu(x, p, 1536)
        else:
            f = lambda: torch.ops.tokenmill.bf16_panel_linear(x, p, n, None)
        ours = flops / best_of(f, flops) / 1e9
        mkl = flops / best_of(lambda: F.linear(x, w), flops) / 1e9
        row.append(f"{what} {ours:4.0f}/{mkl:4.0f}")
    print(f"m {m:4d}: " + "  ".join(row))
