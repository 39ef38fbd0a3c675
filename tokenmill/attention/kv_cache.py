"""KV cache storage per layer: plain (model dtype) or quantized (int8 / fp8 e4m3, with scales).

Layout. Every layer owns K and V as [num_blocks * block_size, Hkv, D] (slot-major: a block is
block_size consecutive rows). A quantized cache stores them as int8 or float8_e4m3fn and adds one
scale per (slot, KV head) for K and one for V, [num_blocks * block_size, Hkv]. The per-layer tuple is
(k, v) for a plain cache and (k_q, v_q, k_scale, v_scale) for a quantized one; the kind and the scale
format are read off the tensors' dtypes, so the model and the runner pass the tuple through blind.

Scales: one per (token, KV head), dynamic (absmax of that head's D values, so the largest maps to
127 for int8 or 448 for e4m3), stored in one byte as a logarithmic code: scale = 2 ** (code / 8),
code = ceil(8 * log2(absmax / qmax)) in int8 [-128, 127]. The code rounds the exact scale up by at
most 2 ** (1/8) = 1.09x (at most 1/8 of a bit of int8 resolution lost) and spans absmax from about
0.002 to 7.5e6 (int8): outside that, tiny heads are quantized on a 2**-16 grid and huge ones clip.
`scale_format="fp32"` keeps the exact float32 scale instead (4 bytes; used to measure what the code
costs). Every token's quantization is final when it is written: a block filled over many decode
steps is never requantized, a full block is immutable, and what the prefix cache shares is exactly
what its first writer stored.

Bytes per token and layer (K and V): 2 * Hkv * (D + 1) with the 1-byte code, i.e. (D + 1) / (2 D) of
bf16: 65/128 = 50.8% for SmolLM2-135M (D = 64), 11,700 vs 23,040 bytes per token; with fp32 scales
68/128 = 53.1%. Exactly half would need scales that take no memory: a per-(block, head) scale gets
to 64.25/128 = 50.2%, but a block filled by decode steps must then be requantized each time its
absmax grows, and those roundings add up (measured in docs/benchmarks/prefix_and_kv_quant.md).
"""
from __future__ import annotations

import ctypes
import functools
import math
import os
from dataclasses import dataclass, replace

import numpy as np
import torch

from tokenmill.host_memory import kv_huge_pages_wanted, lazy_zeros

KV_QUANT_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}
# A plain cache in another float dtype than the model's: bf16 K/V under a float32 model halve the
# bytes a decode step reads (AVX2 CPUs, where dtype auto is float32); float32 rows are rounded as stored
KV_PLAIN_DTYPES = {"bfloat16": torch.bfloat16}
_QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: float(torch.finfo(torch.float8_e4m3fn).max)}  # 448
SCALE_FORMATS = {"log8": torch.int8, "fp32": torch.float32}
_CODE_STEPS = 8.0  # log8 code: 8 steps per octave


@dataclass(frozen=True)
class KVCacheSpec:
    """Per-layer K/V storage of a plain cache in the model dtype."""
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block in one layer, K and V together."""
        return 2 * self.block_size * self.num_kv_heads * self.head_dim * _elem(self.dtype)

    @property
    def bytes_per_token(self) -> float:
        """Per layer, K and V, scales included."""
        return self.bytes_per_block / self.block_size

    def with_num_blocks(self, num_blocks: int) -> KVCacheSpec:
        return replace(self, num_blocks=num_blocks)

    def allocate(self) -> tuple[torch.Tensor, ...]:
        shape = (self.num_blocks * self.block_size, self.num_kv_heads, self.head_dim)
        return zeros(shape, self.dtype), zeros(shape, self.dtype)


@dataclass(frozen=True)
class QuantizedKVCacheSpec(KVCacheSpec):
    """int8 or fp8-e4m3 K/V (`dtype` is the storage dtype) with one scale per (slot, KV head)."""
    scale_format: str = "log8"

    def __post_init__(self) -> None:
        if self.dtype not in _QMAX:
            raise ValueError(f"quantized KV storage must be int8 or float8_e4m3fn, got {self.dtype}")
        if self.scale_format not in SCALE_FORMATS:
            raise ValueError(f"scale_format must be one of {', '.join(SCALE_FORMATS)}; got {self.scale_format!r}")

    @property
    def bytes_per_block(self) -> int:
        per_head_token = self.head_dim * _elem(self.dtype) + _elem(SCALE_FORMATS[self.scale_format])
        return 2 * self.block_size * self.num_kv_heads * per_head_token

    def allocate(self) -> tuple[torch.Tensor, ...]:
        slots = self.num_blocks * self.block_size
        shape = (slots, self.num_kv_heads, self.head_dim)
        scale = SCALE_FORMATS[self.scale_format]
        return (zeros(shape, self.dtype), zeros(shape, self.dtype),
                zeros((slots, self.num_kv_heads), scale), zeros((slots, self.num_kv_heads), scale))


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor whose pages are mapped lazily (an anonymous mapping): allocating a multi-GiB KV
    cache costs nothing at start-up; each page is zeroed by the kernel when first written. torch.zeros
    would memset the whole budget up front (about 4 s for 2.3 GiB here). In 4 KiB pages unless
    TOKENMILL_HUGE_PAGES=all (host_memory.py says why)."""
    nbytes = math.prod(shape) * _elem(dtype)
    return lazy_zeros(nbytes, huge=kv_huge_pages_wanted()).view(dtype).view(shape)


def resident_bytes(tensors) -> int:
    """Bytes of these tensors (nested lists/tuples) the OS has mapped (mincore): a lazily mapped KV
    cache grows towards its budget as blocks are first written, then stays there."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for t in _flat(tensors):
        start = t.data_ptr() - t.data_ptr() % page
        pages = -(-(t.data_ptr() + t.numel() * t.element_size() - start) // page)
        if pages <= 0:
            continue
        vec = (ctypes.c_ubyte * pages)()
        if _libc().mincore(ctypes.c_void_p(start), ctypes.c_size_t(pages * page), vec) != 0:
            return -1  # not an mmap'd range (e.g. a small tensor inside the heap): unknown
        total += int((np.frombuffer(vec, dtype=np.uint8) & 1).sum()) * page
    return total


def _flat(tensors):
    if isinstance(tensors, torch.Tensor):
        yield tensors
    elif isinstance(tensors, (list, tuple)):
        for t in tensors:
            yield from _flat(t)


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def _elem(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def make_kv_cache_spec(kv_cache_dtype: str, model_dtype: torch.dtype, block_size: int, num_kv_heads: int,
                       head_dim: int, num_blocks: int = 1, scale_format: str = "log8") -> KVCacheSpec:
    """`kv_cache_dtype`: auto (the model dtype), bfloat16, int8 or fp8 (e4m3)."""
    if kv_cache_dtype == "auto":
        return KVCacheSpec(num_blocks, block_size, num_kv_heads, head_dim, model_dtype)
    if kv_cache_dtype in KV_PLAIN_DTYPES:
        return KVCacheSpec(num_blocks, block_size, num_kv_heads, head_dim, KV_PLAIN_DTYPES[kv_cache_dtype])
    if kv_cache_dtype not in KV_QUANT_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of auto, {', '.join([*KV_PLAIN_DTYPES, *KV_QUANT_DTYPES])}; "
                         f"got {kv_cache_dtype!r}")
    return QuantizedKVCacheSpec(num_blocks, block_size, num_kv_heads, head_dim, KV_QUANT_DTYPES[kv_cache_dtype],
                                scale_format)


def is_quantized(kv_cache: tuple[torch.Tensor, ...]) -> bool:
    return len(kv_cache) == 4


# -- quantize / dequantize ------------------------------------------------------------------------
def quantize(x: torch.Tensor, dtype: torch.dtype, scale_dtype: torch.dtype = torch.int8
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [..., D] -> (values in `dtype`, one scale per row of D in `scale_dtype`: an int8 log8 code or
    float32)."""
    qmax = _QMAX[dtype]
    exact = x.detach().abs().amax(-1).float() / qmax
    if scale_dtype == torch.int8:
        code = torch.ceil(torch.log2(exact.clamp_min(1e-30)) * _CODE_STEPS).clamp_(-128, 127)
        stored, scale = code.to(torch.int8), torch.exp2(code / _CODE_STEPS)
    else:
        scale = exact.clamp_min(1e-30)
        stored = scale
    y = (x.float() / scale[..., None]).clamp_(-qmax, qmax)
    q = y.round_().to(torch.int8) if dtype == torch.int8 else y.to(dtype)
    return q, stored


def scale_values(stored: torch.Tensor) -> torch.Tensor:
    """Stored scales (log8 codes or float32) -> float32 scales."""
    return torch.exp2(stored.float() / _CODE_STEPS) if stored.dtype == torch.int8 else stored


def dequantize(q: torch.Tensor, stored_scale: torch.Tensor) -> torch.Tensor:
    """q: [..., H, D], stored_scale: [..., H] -> float32."""
    scale = scale_values(stored_scale)[..., None]
    # int8 * float32 promotes inside the multiply (one pass); float8 has no promotion rules
    return torch.mul(q, scale) if q.dtype == torch.int8 else q.float() * scale


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A view the CPU index kernels accept (index_copy_ has no float8 kernel; bytes are bytes)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


# -- the calls backends use ---------------------------------------------------------------------
def write_kv(kv_cache: tuple[torch.Tensor, ...], k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' K/V ([T, Hkv, D]) at their slots, quantizing if the cache is quantized."""
    if not is_quantized(kv_cache):
        kv_cache[0].index_copy_(0, slot_mapping, k.to(kv_cache[0].dtype))
        kv_cache[1].index_copy_(0, slot_mapping, v.to(kv_cache[1].dtype))
        return
    for data, scale, x in ((kv_cache[0], kv_cache[2], k), (kv_cache[1], kv_cache[3], v)):
        q, s = quantize(x, data.dtype, scale.dtype)
        _bytes(data).index_copy_(0, slot_mapping, _bytes(q))
        scale.index_copy_(0, slot_mapping, s)


def gather_blocks(kv_cache: tuple[torch.Tensor, ...], block_table: torch.Tensor, block_size: int,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of whole blocks: block_table [B, NB] -> two [B, NB * block_size, Hkv, D] in `dtype`,
    dequantized if the cache is quantized (only the gathered blocks are)."""
    out = []
    for i in range(2):
        data = kv_cache[i]
        blocks = data.view(-1, block_size, *data.shape[1:])[block_table]          # [B, NB, bs, H, D]
        if is_quantized(kv_cache):
            scale = kv_cache[2 + i].view(-1, block_size, data.shape[1])[block_table]  # [B, NB, bs, H]
            blocks = dequantize(blocks, scale)
        out.append(blocks.flatten(1, 2).to(dtype))
    return out[0], out[1]


def gather_slots(kv_cache: tuple[torch.Tensor, ...], slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V at the given slots ([L] -> two [L, Hkv, D] float32), dequantized if needed."""
    if not is_quantized(kv_cache):
        return kv_cache[0][slots].float(), kv_cache[1][slots].float()
    return dequantize(kv_cache[0][slots], kv_cache[2][slots]), dequantize(kv_cache[1][slots], kv_cache[3][slots])
