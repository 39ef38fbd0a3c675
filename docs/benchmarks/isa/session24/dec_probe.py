import time, torch, os
from tokenmill.kernels import cpu_ops
cpu_ops.load()
torch.set_num_threads(int(os.environ.get("T", 2)))
g = torch.Generator().manual_seed(0)
H, Hkv, D = 9, 3, 64; bs = int(os.environ.get("BS", 32))
B = int(os.environ.get("B", 52))
lo, hi = int(os.environ.get("LO", 64)), int(os.environ.get("HI", 700))
lens = torch.randint(lo, hi, (B,), generator=g)
nb = int(((lens + bs - 1) // bs).sum())
L = int(os.environ.get("L", 6))
from tokenmill.host_memory import lazy_zeros
def mk():
    t = lazy_zeros(nb * bs * Hkv * D * 2, huge=bool(int(os.environ.get("HUGE", 0)))).view(torch.bfloat16).view(nb * bs, Hkv, D)
    t.copy_(torch.randn(nb * bs, Hkv, D, generator=g)); return t
caches = [(mk(), mk()) for _ in range(L)]
perm = torch.arange(nb) if os.environ.get("SEQ") else torch.randperm(nb, generator=g)
maxb = int(((lens + bs - 1) // bs).max())
tables = torch.zeros(B, maxb, dtype=torch.long); o = 0
for b in range(B):
    n = int((lens[b] + bs - 1) // bs); tables[b, :n] = perm[o:o + n]; o += n
q = torch.randn(B, H, D, generator=g)
def run():
    for c in caches: cpu_ops.paged_decode(q, c, tables, lens, bs, D ** -0.5, None)
run()
best = 9
for _ in range(7):
    t = time.perf_counter(); run(); best = min(best, (time.perf_counter() - t) / L)
byts = int(lens.sum()) * Hkv * D * 2 * 2
print(f"B={B} L={L} T={torch.get_num_threads()} {best*1e6:.0f} us per layer, {byts / best / 1e9:.1f} GB/s, {int(lens.sum())/best/1e6:.1f} Mtok/s")
