"""The fused SwiGLU and greedy argmax on the widening path (AVX-512 without BF16) against the unfused
ops they replace, on the default model's shapes, 2 threads, each best of 5 (session 29).

    python docs/benchmarks/isa/session29/fused_widen_probe.py
"""
import torch

from tokenmill.bench.peaks import best_of
from tokenmill.kernels import cpu_ops


def best(fn) -> float:
    return best_of(fn, repeats=5)


def main() -> None:
    assert cpu_ops.load()
    print(cpu_ops.set_isa("avx512"), cpu_ops.isa(), "threads", torch.get_num_threads())
    ops = torch.ops.tokenmill
    g = torch.Generator().manual_seed(0)
    gate_up = ops.pack_bf16_panels(torch.randn(3072, 576, generator=g).bfloat16())
    head = ops.pack_bf16_panels(torch.randn(49152, 576, generator=g).bfloat16())
    for m in (1, 4, 16, 64, 128, 512, 1024):
        x = torch.randn(m, 576, generator=g)
        unfused = lambda: ops.silu_and_mul(ops.bf16_panel_linear(x, gate_up, 3072, None))  # noqa: E731
        fused = lambda: ops.bf16_swiglu(x, gate_up, 1536)  # noqa: E731
        u, f = best(unfused), best(fused)
        print(f"swiglu M={m:5d}: unfused {u * 1e3:7.3f} ms, fused {f * 1e3:7.3f} ms, {u / f:.2f}x")
    for m in (1, 4, 16, 64, 128):
        x = torch.randn(m, 576, generator=g)
        unfused = lambda: ops.bf16_panel_linear(x, head, 49152, None).argmax(-1)  # noqa: E731
        fused = lambda: ops.bf16_argmax_linear(x, head, 49152, 49152)  # noqa: E731
        u, f = best(unfused), best(fused)
        print(f"argmax M={m:5d}: unfused {u * 1e3:7.3f} ms, fused {f * 1e3:7.3f} ms, {u / f:.2f}x")


if __name__ == "__main__":
    main()
