"""The machine's measured peaks, the denominators of every floor: a large matmul's GFLOP/s (torch's
and our panel GEMM's) and memory copy / read GB/s over buffers far larger than the caches, in the
pages the engine's weights and KV cache get (`bench roofline`, `bench host-pages`,
benchmarks/compare_vllm.py)."""
from __future__ import annotations

import time

import torch

from tokenmill.cpu import cpu_has_bf16
from tokenmill.host_memory import lazy_zeros


def best_of(fn, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def peak_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the CPU multiplies `dtype` weights in: bf16 only with AVX512_BF16; without it our
    GEMMs widen bf16 weights to float32 in registers (and torch emulates bf16 matmuls, slower), so
    float32's peak is the floor there."""
    return torch.bfloat16 if dtype == torch.bfloat16 and cpu_has_bf16() else torch.float32


def matmul_peak(dtype: torch.dtype, n: int = 2048) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return 2 * n ** 3 / best_of(lambda: a @ b) / 1e9


def panel_gemm_peak(dtype: torch.dtype, n: int = 2048) -> float | None:
    """Our linear layers' GEMM (bf16 or float32 panels) on a large square problem."""
    from tokenmill.kernels import cpu_ops
    if not cpu_ops.load():
        return None
    x, w = torch.randn(n, n), torch.randn(n, n)
    if dtype == torch.bfloat16:
        packed = torch.ops.tokenmill.pack_bf16_panels(w.bfloat16())
        fn = lambda: torch.ops.tokenmill.bf16_panel_linear(x, packed, n, None)  # noqa: E731
    else:
        packed = torch.ops.tokenmill.pack_panels(w)
        fn = lambda: torch.ops.tokenmill.panel_linear(x, packed, n, None)  # noqa: E731
    return 2 * n ** 3 / best_of(fn) / 1e9


def _buffer(nbytes: int, value: float, huge: bool = True) -> torch.Tensor:
    """float32 buffer in the pages the engine's weights and KV cache get (host_memory.py: huge where
    the kernel allows), so the bandwidth floors are not lowered by TLB misses the engine does not pay."""
    return lazy_zeros(nbytes, huge=huge).view(torch.float32).fill_(value)


def copy_bandwidth(nbytes: int = 1 << 29) -> float:
    src, dst = _buffer(nbytes, 1.0), _buffer(nbytes, 0.0)
    return 2 * nbytes / best_of(lambda: dst.copy_(src)) / 1e9  # read + write


def read_bandwidth(nbytes: int = 1 << 29, huge: bool = True) -> float:
    """Memory read rate (a sum over a buffer far larger than the caches); `huge=False`: on 4 KiB pages."""
    src = _buffer(nbytes, 1.0, huge)
    return nbytes / best_of(src.sum) / 1e9
