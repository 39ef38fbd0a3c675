import torch, time, os
from tokenmill.kernels import cpu_ops
cpu_ops.load()
torch.set_num_threads(int(os.environ.get("T", 2)))
H, Hkv, D = 9, 3, 64
def bench(Lq, ctx, reps=20):
    q = torch.randn(Lq, H, D); k = torch.randn(ctx + Lq, Hkv, D).bfloat16(); v = torch.randn(ctx + Lq, Hkv, D).bfloat16()
    f = lambda: torch.ops.tokenmill.prefill_attention(q, k, v, ctx, D ** -0.5, True)
    f(); best = 9
    for _ in range(reps):
        t = time.perf_counter(); f(); best = min(best, time.perf_counter() - t)
    pairs = sum(ctx + i + 1 for i in range(Lq))
    fl = 4 * pairs * H * D
    print(f"Lq={Lq} ctx={ctx}: {best*1e6:.0f} us, {fl/best/1e9:.0f} GFLOP/s")
for Lq, ctx in [(256, 0), (512, 0), (256, 256), (1, 500), (16, 500), (128, 384)]:
    bench(Lq, ctx)
