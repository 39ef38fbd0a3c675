"""Per-shape bf16 GEMM at M=512 (30 weights, best of 5): float32 x, bf16 x, an output-sized alloc+fill;
run plainly (glibc malloc), with LD_PRELOAD=<tcmalloc> (as `tokenmill serve` runs), or with the
mallopt variant (session26/README)."""
import time, torch
from tokenmill.kernels import cpu_ops
cpu_ops.load()
def best_ms(fn, reps=5):
    fn(); out = 1e9
    for _ in range(reps):
        t = time.perf_counter(); fn(); out = min(out, time.perf_counter() - t)
    return out * 1e3
M, L = 512, 30
for name, n, k in (("qkv", 960, 576), ("o", 576, 576), ("down", 576, 1536), ("gate_up", 3072, 576)):
    ws = [torch.ops.tokenmill.pack_bf16_panels(torch.randn(n, k).bfloat16()) for _ in range(L)]
    x = torch.randn(M, k); xb = x.bfloat16(); gf = 2 * M * n * k * L / 1e9
    cells = {"f32x": lambda: [torch.ops.tokenmill.bf16_panel_linear(x, w, n, None) for w in ws],
             "bf16x": lambda: [torch.ops.tokenmill.bf16_panel_linear(xb, w, n, None) for w in ws],
             "alloc_out": lambda: [torch.empty(M, n) .fill_(0) for w in ws]}
    if name == "gate_up":
        cells["swiglu"] = lambda: [torch.ops.tokenmill.bf16_swiglu(x, w, n // 2) for w in ws]
    r = {c: best_ms(f) for c, f in cells.items()}
    print(name, " ".join(f"{c} {ms/L:.3f}ms/{gf/(ms/1e3):.0f}GF" for c, ms in r.items()), flush=True)
