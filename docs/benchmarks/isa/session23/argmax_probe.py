import time, torch
from tokenmill.kernels import cpu_ops
cpu_ops.load()
N, K = 49152, 576
packed = torch.ops.tokenmill.pack_bf16_panels(torch.randn(N, K).bfloat16())
def ms(fn, rep=20):
    fn(); t = time.perf_counter()
    for _ in range(rep): fn()
    return (time.perf_counter() - t) / rep * 1e3
for m in (8, 40, 100, 128):
    x = torch.randn(m, K)
    r = {}
    for _ in range(3):
        r["logits+argmax"] = min(r.get("logits+argmax", 1e9), ms(lambda: torch.ops.tokenmill.bf16_panel_linear(x, packed, N, None)[:, :N].argmax(-1)))
        r["logits only"] = min(r.get("logits only", 1e9), ms(lambda: torch.ops.tokenmill.bf16_panel_linear(x, packed, N, None)))
        r["fused"] = min(r.get("fused", 1e9), ms(lambda: torch.ops.tokenmill.bf16_argmax_linear(x, packed, N, N)))
    print(f"M={m}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in r.items()), f"ratio {r['logits+argmax']/r['fused']:.2f}x", flush=True)
