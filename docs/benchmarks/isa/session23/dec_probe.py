import time, torch
from tokenmill.kernels import cpu_ops
cpu_ops.load()
g = torch.Generator().manual_seed(0)
H, Hkv, D, bs = 9, 3, 64, 32
B = int(__import__("os").environ.get("B", 64))
lens = torch.randint(64, 700, (B,), generator=g)
nb = int(((lens + bs - 1) // bs).sum())
L = int(__import__("os").environ.get("L", 6))
caches = [tuple(torch.randn(nb * bs, Hkv, D, generator=g).bfloat16() for _ in range(2)) for _ in range(L)]
perm = torch.randperm(nb, generator=g)
maxb = int(((lens + bs - 1) // bs).max())
tables = torch.zeros(B, maxb, dtype=torch.long); o = 0
for b in range(B):
    n = int((lens[b] + bs - 1) // bs); tables[b, :n] = perm[o:o + n]; o += n
q = torch.randn(B, H, D, generator=g)
def run(dp):
    for c in caches: cpu_ops.paged_decode(q, c, tables, lens, bs, D ** -0.5, None, dp)
for dp in (False, True): run(dp)
res = {}
for _ in range(5):
    for dp in (False, True):
        t = time.perf_counter(); run(dp); res[dp] = min(res.get(dp, 9), (time.perf_counter() - t) / L)
byts = int(lens.sum()) * Hkv * D * 2 * 2
for dp in (False, True): print(f"bf16_math={dp}: {res[dp]*1e6:.0f} us per layer, {byts / res[dp] / 1e9:.1f} GB/s")
print(f"ratio {res[False] / res[True]:.2f}x")
a = cpu_ops.paged_decode(q, caches[0], tables, lens, bs, D ** -0.5, None, True)
b = cpu_ops.paged_decode(q, caches[0], tables, lens, bs, D ** -0.5, None, False)
print("max |bf16 - f32 math|", (a - b).abs().max().item(), "max |out|", b.abs().max().item())
