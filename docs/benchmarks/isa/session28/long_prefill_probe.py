"""A long prompt's chunks, as the mix workload's 3-5 K-token prompts run with a 1024-token budget:
prefill attention per chunk (1024 queries after 0-3072 cached keys) and the gather of the cached K/V
from the paged cache that precedes it; the linear layers of the same chunk for scale (one layer).
python docs/benchmarks/isa/session28/long_prefill_probe.py
With --loop S it only runs the 3072-key case for S seconds, for a profiler:
perf record -F 999 -g -o perf.data python docs/benchmarks/isa/session28/long_prefill_probe.py --loop 12
perf report -i perf.data --no-children --sort symbol"""
import sys, torch, time
from tokenmill.kernels import cpu_ops
from tokenmill.attention.kv_cache import gather_blocks
cpu_ops.load()
torch.set_num_threads(2)
H, Hkv, D, bs = 9, 3, 64, 32
g = torch.Generator().manual_seed(0)
nblocks = 3340
cache = (torch.randn(nblocks * bs, Hkv, D, generator=g).bfloat16(), torch.randn(nblocks * bs, Hkv, D, generator=g).bfloat16())
def best(f, reps=7):
    f(); b = 9
    for _ in range(reps):
        t = time.perf_counter(); f(); b = min(b, time.perf_counter() - t)
    return b
Lq = 1024
if "--loop" in sys.argv:
    seconds = float(sys.argv[sys.argv.index("--loop") + 1])
    q = torch.randn(Lq, H, D, generator=g)
    kb, vb = (torch.randn(3072 + Lq, Hkv, D, generator=g).bfloat16() for _ in range(2))
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        torch.ops.tokenmill.prefill_attention(q, kb, vb, 3072, D ** -0.5, True)
    sys.exit(0)
table = torch.randperm(nblocks, generator=g)[:(4096 + Lq) // bs].unsqueeze(0)
for ctx in (0, 1024, 2048, 3072, 4096):
    q = torch.randn(Lq, H, D, generator=g)
    length = ctx + Lq
    nb = (length + bs - 1) // bs
    gat = lambda: [x[0, :length] for x in gather_blocks(cache, table[:, :nb], bs, torch.bfloat16)]
    kb, vb = gat()
    att = lambda: torch.ops.tokenmill.prefill_attention(q, kb, vb, ctx, D ** -0.5, True)
    tg, ta = best(gat), best(att)
    fl = 4 * sum(ctx + i + 1 for i in range(Lq)) * H * D
    lin = 2 * Lq * 3.54e6  # one layer's linear FLOPs for the chunk
    print(f"chunk of {Lq} after {ctx:4d}: gather {tg*1e3:6.2f} ms, attention {ta*1e3:6.2f} ms ({fl/ta/1e9:4.0f} GFLOP/s); "
          f"one layer's linears at 400 GFLOP/s: {lin/400e9*1e3:5.2f} ms")
