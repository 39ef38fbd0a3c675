"""A prefill engine's KV cache in one named shared-memory region, readable by block id.

Layout (offsets follow from the block count and each tensor's bytes per block, so a reader that
knows both finds every block without any other description):

    [control: lease[SLOTS] int64, ack[SLOTS] int64] [tensor 0: num_blocks x block_bytes[0]] [tensor 1] ...

Tensors are each layer's K/V storage (and scales, for a quantized cache), in the order the model
runner holds them; each starts on a 64-byte boundary. A transfer owns control slot
`transfer_id % SLOTS`: the sender writes the transfer id into lease[slot] while it holds the
request's blocks and clears it before freeing them; the receiver checks the lease before and after
copying (a copy the lease did not cover is refused) and writes the transfer id into ack[slot] when
it is done, which tells the sender it may free the blocks.
"""
from __future__ import annotations

import atexit
import os
import uuid
import zlib
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import torch

SLOTS = 4096
REGION_PREFIX = "tokenmill-kv-"  # a receiver attaches no other shared memory
_ALIGN = 64
_CONTROL_BYTES = 2 * SLOTS * 8


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def tensor_offsets(num_blocks: int, block_bytes: list[int]) -> tuple[list[int], int]:
    """Offset of each tensor and the region's total size."""
    offsets, at = [], _CONTROL_BYTES
    for b in block_bytes:
        at = _align(at)
        offsets.append(at)
        at += num_blocks * b
    return offsets, at


def flat_tensors(kv_caches: list) -> list[torch.Tensor]:
    return [t for layer in kv_caches for t in layer]


def block_bytes_of(tensors: list[torch.Tensor], num_blocks: int) -> list[int]:
    return [t.numel() * t.element_size() // num_blocks for t in tensors]


def byte_rows(t: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """A uint8 view of a KV tensor, one row per block."""
    return t.view(-1).view(torch.uint8).view(num_blocks, -1)


def block_checksums(rows: list[torch.Tensor], block_ids: list[int]) -> list[int]:
    """crc32 of each block over every tensor, in tensor order."""
    crcs = [0] * len(block_ids)
    for r in rows:
        arr = r.numpy()  # a view: no copy
        for j, b in enumerate(block_ids):
            crcs[j] = zlib.crc32(arr[b], crcs[j])
    return crcs


class KVRegion:
    """Owner side: create the region and re-home the KV tensors into it."""

    def __init__(self, kv_caches: list, num_blocks: int) -> None:
        tensors = flat_tensors(kv_caches)
        self.num_blocks = num_blocks
        self.block_bytes = block_bytes_of(tensors, num_blocks)
        offsets, size = tensor_offsets(num_blocks, self.block_bytes)
        self.name = f"{REGION_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.shm = shared_memory.SharedMemory(name=self.name, create=True, size=size)
        self.control = np.ndarray((2, SLOTS), np.int64, buffer=self.shm.buf, offset=0)
        self.control[:] = 0
        shared = []
        for t, off in zip(tensors, offsets):
            s = torch.frombuffer(self.shm.buf, dtype=t.dtype, count=t.numel(), offset=off).view(t.shape)
            s.copy_(t)
            shared.append(s)
        it = iter(shared)
        self.kv_caches = [tuple(next(it) for _ in layer) for layer in kv_caches]
        self.rows = [byte_rows(t, num_blocks) for t in shared]
        atexit.register(self.close)

    @property
    def lease(self) -> np.ndarray:
        return self.control[0]

    @property
    def ack(self) -> np.ndarray:
        return self.control[1]

    def close(self) -> None:
        try:
            self.shm.unlink()
        except FileNotFoundError:
            pass


class RemoteRegion:
    """Reader side: another engine's region, attached by name (never unlinked by the reader)."""

    def __init__(self, name: str, num_blocks: int, block_bytes: list[int]) -> None:
        self.shm = shared_memory.SharedMemory(name=name, create=False)
        # Python < 3.13 registers an attached segment for unlinking at this process's exit: the owner unlinks it
        resource_tracker.unregister(self.shm._name, "shared_memory")  # noqa: SLF001
        offsets, size = tensor_offsets(num_blocks, block_bytes)
        if self.shm.size < size:
            raise ValueError(f"region {name} is {self.shm.size} bytes, its description needs {size}")
        self.control = np.ndarray((2, SLOTS), np.int64, buffer=self.shm.buf, offset=0)
        self.rows = [torch.from_numpy(np.ndarray((num_blocks, b), np.uint8, buffer=self.shm.buf, offset=off))
                     for b, off in zip(block_bytes, offsets)]
        self.block_bytes = list(block_bytes)

    @property
    def lease(self) -> np.ndarray:
        return self.control[0]

    @property
    def ack(self) -> np.ndarray:
        return self.control[1]
