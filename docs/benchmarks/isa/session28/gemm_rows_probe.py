"""Our bf16 GEMMs at the row counts W1's steps use (decode 8-128 rows, mixed 512-1024), the default
model's shapes, 2 threads, best of 5; and torch's 2048^3 bf16 matmul in the same process.
python docs/benchmarks/isa/session28/gemm_rows_probe.py"""
import torch, time
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
a = torch.randn(2048, 2048).bfloat16(); b = torch.randn(2048, 2048).bfloat16()
print(f"torch 2048^3 bf16 matmul: {2 * 2048**3 / best_of(lambda: a @ b, 2 * 2048**3) / 1e9:.0f} GFLOP/s")
for m in (8, 32, 64, 128, 256, 512, 1024):
    row = []
    for (n, k, what) in [(960, 576, "qkv"), (576, 576, "o"), (3072, 576, "swiglu"), (576, 1536, "down")]:
        w = torch.randn(n, k, generator=g).bfloat16(); x = torch.randn(m, k, generator=g).bfloat16()
        p = torch.ops.tokenmill.pack_bf16_panels(w)
        if what == "swiglu":
            f = lambda: torch.ops.tokenmill.bf16_swiglu(x, p, 1536)
            flops = 2 * m * n * k
        else:
            f = lambda: torch.ops.tokenmill.bf16_panel_linear(x, p, n, None)
            flops = 2 * m * n * k
        row.append(f"{what} {flops / best_of(f, flops) / 1e9:4.0f}")
    print(f"M={m:5d}: " + "  ".join(row) + " GFLOP/s")
