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
import itertools
V=[tuple(map(int,v.split(":"))) for v in os.environ.get("V","96:2:0,96:2:1").split(",")]
res={}
for _ in range(int(os.environ.get("R",4))):
    for v in V:
        os.environ["PFD"],os.environ["PFH"],os.environ["FUSED"],os.environ["MODE"]=str(v[0]),str(v[1]),str(v[2]),str(v[3] if len(v)>3 else 0)
        t=time.perf_counter(); run(); res[v]=min(res.get(v,9),(time.perf_counter()-t)/L)
byts = int(lens.sum()) * Hkv * D * 2 * 2
for v in V: print(f"PFD={v[0]} PFH={v[1]} FUSED={v[2]}: {res[v]*1e6:.0f} us per layer, {byts / res[v] / 1e9:.1f} GB/s")

outs={}
for v in V:
    os.environ["PFD"],os.environ["PFH"],os.environ["FUSED"],os.environ["MODE"]=str(v[0]),str(v[1]),str(v[2]),str(v[3] if len(v)>3 else 0)
    outs[v]=cpu_ops.paged_decode(q, caches[0], tables, lens, bs, D ** -0.5, None)
import math
# float64 reference for 3 sequences
c=caches[0]
err=0
for b in range(0,B,max(1,B//4)):
    n=int(lens[b]); sl=torch.cat([torch.arange(int(tables[b,i])*bs, int(tables[b,i])*bs+bs) for i in range((n+bs-1)//bs)])[:n]
    K=c[0][sl].double(); Vv=c[1][sl].double()
    for hq in range(H):
        hk=hq//(H//Hkv); p=torch.softmax((K[:,hk]@q[b,hq].double())*D**-0.5,0); ref=p@Vv[:,hk]
        for v in V: err=max(err,(outs[v][b,hq].double()-ref).abs().max().item())
print("max err vs float64", err)
