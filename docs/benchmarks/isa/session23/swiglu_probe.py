import time, torch
from tokenmill.kernels import cpu_ops
cpu_ops.load()
def ms(fn, rep):
    fn(); t=time.perf_counter()
    for _ in range(rep): fn()
    return (time.perf_counter()-t)/rep*1e3
L=8; I=1536; K=576
gu=[torch.ops.tokenmill.pack_bf16_panels(torch.randn(2*I,K).bfloat16()) for _ in range(L)]
dn=[torch.ops.tokenmill.pack_bf16_panels(torch.randn(K,I).bfloat16()) for _ in range(L)]
for m in (3, 8, 40, 128, 512, 1024):
    x=torch.randn(m,K)
    def unf():
        for a,b in zip(gu,dn): torch.ops.tokenmill.bf16_panel_linear(torch.ops.tokenmill.silu_and_mul(torch.ops.tokenmill.bf16_panel_linear(x,a,2*I,None)),b,K,None)
    def fus():
        for a,b in zip(gu,dn): torch.ops.tokenmill.bf16_panel_linear(torch.ops.tokenmill.bf16_swiglu(x,a,I),b,K,None)
    def gu_only():
        for a in gu: torch.ops.tokenmill.bf16_panel_linear(x,a,2*I,None)
    def sw_only():
        for a in gu: torch.ops.tokenmill.bf16_swiglu(x,a,I)
    r={}
    for _ in range(3):
        for n,f in (("unfused",unf),("fused",fus),("gemm_gu",gu_only),("swiglu_k",sw_only)):
            r[n]=min(r.get(n,1e9), ms(f, 3 if m>=512 else 10)/L)
    fl=2*m*K*3*I
    print(f"M={m:5d} MLP ms unfused {r['unfused']:.3f} fused {r['fused']:.3f} ratio {r['unfused']/r['fused']:.2f}x | gate_up GEMM {2*m*K*2*I/r['gemm_gu']/1e6:.0f} GFLOP/s, fused kernel {2*m*K*2*I/r['swiglu_k']/1e6:.0f} GFLOP/s", flush=True)
