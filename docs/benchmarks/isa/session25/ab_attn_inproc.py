import torch, time, os
from tokenmill.kernels import cpu_ops
cpu_ops.load()
torch.set_num_threads(2)
H, Hkv, D = 9, 3, 64
res = {}
for rnd in range(3):
    for Lq, ctx in [(256, 0), (512, 0), (128, 384), (512, 1536), (16, 500), (1, 500)]:
        q = torch.randn(Lq, H, D); k = torch.randn(ctx + Lq, Hkv, D).bfloat16(); v = torch.randn(ctx + Lq, Hkv, D).bfloat16()
        for mode in ("old", "new", "old", "new"):
            os.environ["TM_AB"] = mode
            f = lambda: torch.ops.tokenmill.prefill_attention(q, k, v, ctx, D ** -0.5, True)
            f(); best = 9
            for _ in range(10):
                t = time.perf_counter(); f(); best = min(best, time.perf_counter() - t)
            key = (Lq, ctx, mode); res[key] = min(res.get(key, 9), best)
for Lq, ctx in [(256, 0), (512, 0), (128, 384), (512, 1536), (16, 500), (1, 500)]:
    a, b = res[(Lq, ctx, "old")], res[(Lq, ctx, "new")]
    fl = 4 * sum(ctx + i + 1 for i in range(Lq)) * H * D
    print(f"Lq={Lq} ctx={ctx}: old {a*1e6:.0f} us ({fl/a/1e9:.0f} GFLOP/s)  new {b*1e6:.0f} us ({fl/b/1e9:.0f})  old/new {a/b:.2f}x")
