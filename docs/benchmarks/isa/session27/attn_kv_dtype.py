"""prefill_attention (bf16 math) on a fresh prompt: k/v handed over as float32 (bf16-representable, as the
engine passes this step's rows) vs as bf16 (the 32-bit-word pack path). q, k, v strided views of one
[L, 960] qkv output as in the engine. Same process, alternated, best of 10 calls x 3 rounds; outputs compared."""
import time
import torch
from tokenmill.kernels import cpu_ops
cpu_ops.load()
torch.set_num_threads(2)
H, Hkv, D = 9, 3, 64
res = {}
for rnd in range(3):
    for L in (256, 512, 1024, 1900):
        qkv = torch.randn(L, (H + 2 * Hkv) * D).bfloat16().float()
        q = qkv[:, :H * D].view(L, H, D)
        k = qkv[:, H * D:(H + Hkv) * D].view(L, Hkv, D)
        v = qkv[:, (H + Hkv) * D:].view(L, Hkv, D)
        kb, vb = k.bfloat16(), v.bfloat16()
        a = torch.ops.tokenmill.prefill_attention(q, k, v, 0, D ** -0.5, True)
        b = torch.ops.tokenmill.prefill_attention(q, kb, vb, 0, D ** -0.5, True)
        assert torch.equal(a, b), (L, (a - b).abs().max())
        for mode, (kk, vv) in (("f32", (k, v)), ("bf16", (kb, vb))) * 2:
            f = lambda: torch.ops.tokenmill.prefill_attention(q, kk, vv, 0, D ** -0.5, True)
            f(); best = 9
            for _ in range(10):
                t = time.perf_counter(); f(); best = min(best, time.perf_counter() - t)
            res[(L, mode)] = min(res.get((L, mode), 9), best)
for L in (256, 512, 1024, 1900):
    a, b = res[(L, "f32")], res[(L, "bf16")]
    fl = 2 * H * D * L * L
    print(f"L={L}: k/v float32 {a*1e6:.0f} us ({fl/a/1e9:.0f} GFLOP/s)  k/v bf16 {b*1e6:.0f} us ({fl/b/1e9:.0f})  f32/bf16 {a/b:.2f}x")
