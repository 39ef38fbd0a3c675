import sys, time, torch
from tokenmill.kernels import cpu_ops; assert cpu_ops.load()
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
torch.manual_seed(0)
L = 2048
q = torch.randn(L, 9, 64); k = torch.randn(L, 3, 64); v = torch.randn(L, 3, 64)
flop = 2 * 9 * 64 * L * L
t0 = time.time(); n = 0
while time.time() - t0 < float(sys.argv[1]):
    s = time.perf_counter(); torch.ops.tokenmill.prefill_attention(q, k, v, 0, 0.125, False); n += 1
    e = time.perf_counter() - s
print(f"{n} calls, last {e*1e3:.1f} ms, {flop/e/1e9:.0f} GF/s")
