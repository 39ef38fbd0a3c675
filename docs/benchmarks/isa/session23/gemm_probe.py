import sys, time, torch
from tokenmill.kernels import cpu_ops
cpu_ops.load()
def ms(fn, rep):
    fn(); t=time.perf_counter()
    for _ in range(rep): fn()
    return (time.perf_counter()-t)/rep*1e3
for th in (1, 2):
    torch.set_num_threads(th)
    for n,k in ((3072,576),(576,1536),(960,576),(576,576)):
        L=8
        ws=[torch.randn(n,k) for _ in range(L)]
        bf=[torch.ops.tokenmill.pack_bf16_panels(w.bfloat16()) for w in ws]
        od=[torch.ops.mkldnn._reorder_linear_weight(w.bfloat16()) for w in ws]
        for m in (128, 1024):
            x=torch.randn(m,k); xb=x.bfloat16()
            xr = [None]
            fns={"ours":lambda: [torch.ops.tokenmill.bf16_panel_linear(x,b,n,None) for b in bf],
                 "ours_bfx":lambda: [torch.ops.tokenmill.bf16_panel_linear(xb,b,n,None) for b in bf],
                 "onednn":lambda: [torch.ops.mkldnn._linear_pointwise(xb,w,None,"none",[],"") for w in od],
                 "onednn_f32out":lambda: [torch.ops.mkldnn._linear_pointwise(xb,w,None,"none",[],"").float() for w in od]}
            res={}
            for _ in range(3):
                for name,f in fns.items():
                    t=ms(f, 3)/L
                    res[name]=min(res.get(name,1e9),t)
            print(f"th{th} {n}x{k} M={m}: "+", ".join(f"{a} {2*m*n*k/(t/1e3)/1e9:.0f}" for a,t in res.items()), flush=True)
