"""KV blocks: reference counts, an LRU free queue, and the content-hash table of cached blocks."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tokenmill.core.kv_events import KVEventLog


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None  # set once the block is full and cached


# Stands in a request's block list for a block freed because every future token's sliding window
# lies past it (the list keeps its positions: block i still holds tokens i*bs..).
NULL_BLOCK = KVBlock(block_id=-1)


class BlockPool:
    """Invariant: a block is in the free queue iff its ref_cnt is 0. A free block may still hold a
    cached prefix (block_hash set); it is evicted lazily, when allocation takes it."""

    def __init__(self, num_blocks: int, enable_caching: bool = True, events: KVEventLog | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # OrderedDict as an LRU queue: the front is evicted first.
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[bytes, KVBlock] = {}
        self.num_evictions = 0
        self.events = events  # stored/evicted hashes for routers (None: not recorded)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def allocate(self, n: int) -> list[KVBlock]:
        if n > len(self.free_queue):
            raise RuntimeError(f"cannot allocate {n} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(n):
            block_id, _ = self.free_queue.popitem(last=False)
            block = self.blocks[block_id]
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            if self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
                if self.events is not None:
                    self.events.removed(block.block_hash)
            block.block_hash = None
            self.num_evictions += 1

    def lookup(self, block_hash: bytes) -> KVBlock | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take a reference on cached blocks found by lookup (removing free ones from the queue)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def cache_block(self, block: KVBlock, block_hash: bytes) -> None:
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self.cached:  # an identical block exists already (computed concurrently)
            return
        block.block_hash = block_hash
        self.cached[block_hash] = block
        if self.events is not None:
            self.events.stored(block_hash)

    def free(self, blocks: list[KVBlock]) -> None:
        """Drop one reference each. Pass blocks tail-first so a sequence's tail is evicted before its
        shared head. A block that holds no cached prefix goes to the front of the queue: it is worth
        nothing, so it is reused first, before any cached block is evicted, and its memory is still
        in the CPU's caches (and mapped: a block never used before costs page faults on its first
        write)."""
        for block in blocks:
            if block is NULL_BLOCK:
                continue
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, f"block {block.block_id} ref_cnt < 0"
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = None
                if block.block_hash is None:
                    self.free_queue.move_to_end(block.block_id, last=False)

    def reset_cache(self) -> bool:
        """Forget all cached hashes; only allowed when no block is in use."""
        if self.num_used_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        if self.events is not None:
            self.events.cleared()
        return True
