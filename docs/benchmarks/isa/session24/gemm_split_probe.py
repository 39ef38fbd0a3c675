import torch, time, os
from tokenmill.kernels import cpu_ops
cpu_ops.load()
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
for (m, n, k, what) in [(128, 576, 576, "o_proj"), (128, 576, 1536, "down"), (128, 960, 576, "qkv"), (1024, 576, 1536, "down-prefill"), (128, 3072, 576, "gate_up swiglu")]:
    w = torch.randn(n, k, generator=g).bfloat16(); x = torch.randn(m, k, generator=g).bfloat16()
    p = torch.ops.tokenmill.pack_bf16_panels(w)
    f = (lambda: torch.ops.tokenmill.bf16_swiglu(x, p, n // 2)) if "swiglu" in what else (lambda: torch.ops.tokenmill.bf16_panel_linear(x, p, n, None))
    for _ in range(3): f()
    reps = max(3, int(2e9 / (2 * m * n * k)))
    best = 9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps): f()
        best = min(best, (time.perf_counter() - t) / reps)
    print(f"{what} M={m} N={n} K={k}: {best*1e6:.0f} us, {2*m*n*k/best/1e9:.0f} GFLOP/s")
