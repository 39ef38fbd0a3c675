"""Gather a loaded model's weights into one huge-page arena (host_memory.py explains why).

After loading and repacking, each weight is its own malloc region of 4 KiB pages. `gather_weights`
copies every large tensor the model's modules hold (parameters, buffers, and plain tensor attributes
such as packed panels or block records) into one 2 MiB-aligned, huge-page-advised buffer and points
the modules at views of it. Ties survive: a tensor held by two modules (a tied embedding and LM head)
is copied once and both get the same view, and a Parameter stays a Parameter. The originals are
freed as their last reference goes, so the peak is the model plus one copy of the moved weights.

Not moved: meta tensors (shapes kept for counting), non-strided ones (oneDNN's opaque layouts), views
that do not own their whole storage (moving them would break the aliasing), and tensors under
`min_bytes` (norm weights: too small to matter). The views of the model's previous arena are the
exception: gathering again moves them into a new arena (`huge=False` measures what the advice buys:
`python -m tokenmill.bench.host_pages`) and the old one is freed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from tokenmill.host_memory import huge_pages_wanted, lazy_zeros

logger = logging.getLogger(__name__)

_ALIGN = 64  # cache-line aligned slots: the kernels' vector loads never straddle lines more than before
_ARENA_ATTR = "weight_arena"  # the model's ArenaStats, holding its buffer


@dataclass
class ArenaStats:
    tensors: int = 0
    bytes: int = 0
    huge: bool = False  # the buffer was advised (whether the kernel granted it: host_memory.anon_huge_bytes)
    buffer: torch.Tensor | None = field(default=None, repr=False)


def _movable(t: torch.Tensor, min_bytes: int, previous: int | None) -> bool:
    if t.device.type != "cpu" or t.layout != torch.strided or t.is_mkldnn or t.is_quantized:
        return False
    nbytes = t.numel() * t.element_size()
    if not t.is_contiguous() or nbytes < min_bytes:
        return False
    storage = t.untyped_storage()
    if previous is not None and storage.data_ptr() == previous:
        return True  # a view of the previous arena
    return t.storage_offset() == 0 and storage.nbytes() == nbytes


def _holders(model: nn.Module) -> list[tuple[nn.Module, str, str, torch.Tensor]]:
    """(module, kind, name, tensor) for every tensor slot in the model (a shared tensor appears once
    per module that holds it)."""
    out = []
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                out.append((module, "param", name, p))
        for name, b in module._buffers.items():
            if b is not None:
                out.append((module, "buffer", name, b))
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                out.append((module, "attr", name, value))
    return out


def gather_weights(model: nn.Module, min_bytes: int = 64 << 10, huge: bool = True) -> ArenaStats:
    """Move the model's large weights into one arena (huge-page advised unless `huge` is False), in
    place; returns what moved (also kept as `model.weight_arena`)."""
    old = model.__dict__.get(_ARENA_ATTR)
    previous = old.buffer.untyped_storage().data_ptr() if old is not None and old.buffer is not None else None
    slots = [h for h in _holders(model) if _movable(h[3], min_bytes, previous)]
    offsets: dict[int, int] = {}  # storage address -> offset in the arena
    size = 0
    for _, _, _, t in slots:
        key = t.data_ptr()
        if key not in offsets:
            offsets[key] = size
            size += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    if not offsets:
        return ArenaStats()
    arena = lazy_zeros(size, huge=huge)
    views: dict[tuple, torch.Tensor] = {}  # (storage address, dtype, shape) -> its view of the arena
    params: dict[tuple, nn.Parameter] = {}  # one Parameter per view, so ties stay one object
    for module, kind, name, t in slots:
        key = (t.data_ptr(), t.dtype, tuple(t.shape))
        view = views.get(key)
        if view is None:
            start = offsets[t.data_ptr()]
            view = arena[start:start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t)
            views[key] = view
        if kind == "param":
            if key not in params:
                params[key] = nn.Parameter(view, requires_grad=False)
            module._parameters[name] = params[key]
        elif kind == "buffer":
            module._buffers[name] = view
        else:
            module.__dict__[name] = view
    stats = ArenaStats(len(offsets), size, huge and huge_pages_wanted(), arena)
    model.__dict__[_ARENA_ATTR] = stats
    logger.debug("weight arena: %d tensors, %.1f MiB", stats.tensors, stats.bytes / 2**20)
    return stats
