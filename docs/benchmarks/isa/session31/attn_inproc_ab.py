# Needs the temporary toggle described in attn_inproc_ab_results.txt (not in the tree): the old path as
# attend_block_old, chosen when TM_PF_OLD is set. Kept as the record of how the ratios were taken.
import os, sys, time, torch
from tokenmill.kernels import cpu_ops; assert cpu_ops.load()
torch.set_num_threads(2)
torch.manual_seed(0)
def case(L, ctx=0, bf16=False):
    q = torch.randn(L, 9, 64); k = torch.randn(ctx + L, 3, 64); v = torch.randn(ctx + L, 3, 64)
    if bf16: k, v = k.bfloat16(), v.bfloat16()
    return q, k, v, ctx
def run(c):
    q, k, v, ctx = c
    return torch.ops.tokenmill.prefill_attention(q, k, v, ctx, 64 ** -0.5)
def t(c, reps):
    best = 1e9
    for _ in range(reps):
        s = time.perf_counter(); run(c); best = min(best, time.perf_counter() - s)
    return best
for L, ctx in [(512, 0), (1024, 0), (2048, 0), (1024, 3072), (128, 1024)]:
    c = case(L, ctx)
    os.environ["TM_PF_OLD"] = "1"; a = run(c)
    os.environ.pop("TM_PF_OLD"); b = run(c)
    err = ((a - b).abs().max() / a.abs().max()).item()
    flop = 2 * 9 * 64 * L * (2 * ctx + L)
    reps = max(3, int(2e9 / flop))
    ro, rn = [], []
    for rnd in range(4):
        os.environ["TM_PF_OLD"] = "1"; ro.append(t(c, reps))
        os.environ.pop("TM_PF_OLD"); rn.append(t(c, reps))
    o, n = min(ro), min(rn)
    print(f"L={L} ctx={ctx}: old {o*1e3:.2f} ms ({flop/o/1e9:.0f} GF/s)  new {n*1e3:.2f} ms ({flop/n/1e9:.0f} GF/s)  {o/n:.2f}x  maxrel {err:.1e}", flush=True)
