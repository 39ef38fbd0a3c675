"""KV cache manager: three calls (find cached prefix, allocate slots, free) over a BlockPool, plus
`cache_blocks`, which makes blocks findable once their KV is written."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from tokenmill.core.block_pool import NULL_BLOCK, BlockPool, KVBlock
from tokenmill.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hash_block(parent: bytes | None, tokens: list[int], extra_key: str) -> bytes:
    """Chained content hash: equal hashes mean equal whole prefixes (sha256, so no practical collisions)."""
    h = hashlib.sha256(parent or extra_key.encode())
    h.update(b",".join(str(t).encode() for t in tokens))
    return h.digest()


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0     # prompt tokens found cached


class KVCacheManager:
    """`extra_key` is everything besides the tokens that changes the KV bytes: the model's content
    identity (architecture, config, dtype, weights' fingerprint) and the KV cache dtype — never a
    local path, so two engines on different machines agree on every block hash.

    `sliding_window` (every layer attends only to its last W tokens): a block that lies wholly
    before the window of every token still to be computed goes back to the pool as soon as the
    request next allocates (its place in the request's list holds NULL_BLOCK); a cached one stays
    findable by hash until it is reused."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 extra_key: str = "", watermark: float = 0.01, sliding_window: int | None = None) -> None:
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.pool = BlockPool(num_blocks, enable_caching)
        self.enable_caching = enable_caching
        self.extra_key = extra_key
        self.watermark_blocks = int(watermark * num_blocks)
        self.req_blocks: dict[str, list[KVBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}  # leading blocks of a request already offered to the cache
        self.num_skipped_blocks: dict[str, int] = {}  # leading blocks freed behind the sliding window
        self.prefix_stats = PrefixCacheStats()

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    def block_hashes(self, request: Request, num_tokens: int) -> list[bytes]:
        """Hashes of the full blocks among the first num_tokens tokens, extended incrementally."""
        hashes = request.block_hashes
        bs = self.block_size
        while len(hashes) < num_tokens // bs:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, request.all_token_ids[i * bs:(i + 1) * bs], self.extra_key))
        return hashes

    # -- call 1 ---------------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of full blocks. Leaves at least one token to compute, so there are
        logits to sample from. A request that asks for prompt logprobs gets none: the cache holds
        K/V, not the logits of those positions, so it computes its whole prompt (as vLLM). Its own
        blocks are still offered to the cache for others."""
        if not self.enable_caching or request.params.prompt_logprobs is not None:
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks: list[KVBlock] = []
        for h in self.block_hashes(request, max_blocks * self.block_size)[:max_blocks]:
            block = self.pool.lookup(h)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    # -- call 2 ---------------------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int, computed_blocks: list[KVBlock] | None = None,
                       num_lookahead_tokens: int = 0, admit: bool = False) -> bool:
        """Make room for num_new_tokens (plus num_lookahead_tokens speculative slots) after the
        computed ones. `computed_blocks` are cached prefix blocks a waiting request adopts. New
        admissions keep a watermark of free blocks, so running requests can grow before anyone has
        to be preempted. Returns False if it does not fit. Nothing becomes findable by hash here:
        see cache_blocks."""
        computed_blocks = computed_blocks or []
        self.free_outside_window(request)
        owned = self.req_blocks.get(request.request_id, [])
        num_computed = request.num_computed_tokens + len(computed_blocks) * self.block_size
        total = num_computed + num_new_tokens + num_lookahead_tokens
        needed = cdiv(total, self.block_size) - len(owned) - len(computed_blocks)
        computed_blocks = self._visible(computed_blocks, len(owned), num_computed)
        # Cached blocks with ref 0 sit in the free queue: adopting them uses free capacity too.
        reviving = sum(1 for b in computed_blocks if b.ref_cnt == 0 and b is not NULL_BLOCK)
        reserve = self.watermark_blocks if admit else 0
        if needed + reviving > self.pool.num_free_blocks - reserve:
            return False
        self.pool.touch([b for b in computed_blocks if b is not NULL_BLOCK])
        blocks = self.req_blocks.setdefault(request.request_id, owned)
        blocks.extend(computed_blocks)
        if needed > 0:
            blocks.extend(self.pool.allocate(needed))
        if computed_blocks:
            self.num_cached_blocks[request.request_id] = len(computed_blocks)
            # an adopted prefix longer than the window: keep only what the next token can see
            self.free_outside_window(request, num_computed)
        return True

    def _visible(self, computed_blocks: list[KVBlock], first_index: int, next_position: int) -> list[KVBlock]:
        """An adopted prefix longer than the window: the blocks no future token sees are never
        taken (NULL_BLOCK holds their places), so they cost no free capacity — counting them made a
        long cached prompt unadmittable in a pool smaller than the prompt."""
        if self.sliding_window is None or not computed_blocks:
            return computed_blocks
        hidden = max(0, next_position - self.sliding_window + 1) // self.block_size - first_index
        hidden = min(max(0, hidden), len(computed_blocks))
        return [NULL_BLOCK] * hidden + computed_blocks[hidden:]

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """The KV of the first num_computed_tokens tokens is written (a step computed it, or a
        transfer landed): their full blocks become findable by hash. Never call it for slots whose
        KV is not final (rolled-back speculative tokens are never passed here)."""
        if not self.enable_caching:
            return
        blocks = self.req_blocks.get(request.request_id)
        if not blocks:
            return
        num_full = min(num_computed_tokens, request.num_tokens) // self.block_size
        done = self.num_cached_blocks.get(request.request_id, 0)
        if num_full <= done:
            return
        hashes = self.block_hashes(request, num_full * self.block_size)
        for i in range(done, num_full):
            if blocks[i] is not NULL_BLOCK and blocks[i].block_hash is None:
                self.pool.cache_block(blocks[i], hashes[i])
        self.num_cached_blocks[request.request_id] = num_full

    def free_outside_window(self, request: Request, next_position: int | None = None) -> None:
        """Free the blocks no future token can see: the next token to compute is at position
        `next_position` (default num_computed_tokens), and it (like every later one) sees keys from
        position next_position - W + 1 on."""
        if self.sliding_window is None:
            return
        blocks = self.req_blocks.get(request.request_id)
        if not blocks:
            return
        nxt = request.num_computed_tokens if next_position is None else next_position
        first_visible = max(0, nxt - self.sliding_window + 1)
        done = self.num_skipped_blocks.get(request.request_id, 0)
        end = min(first_visible // self.block_size, len(blocks))
        if end <= done:
            return
        skipped = blocks[done:end]
        blocks[done:end] = [NULL_BLOCK] * (end - done)
        self.num_skipped_blocks[request.request_id] = end
        self.pool.free(list(reversed(skipped)))

    # -- call 3 ---------------------------------------------------------------------------------
    def free(self, request: Request) -> None:
        blocks = self.req_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.num_skipped_blocks.pop(request.request_id, None)
        self.pool.free(list(reversed(blocks)))

    # -- queries --------------------------------------------------------------------------------
    def block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_blocks.get(request_id, [])]

    def usage(self) -> float:
        return self.pool.num_used_blocks / self.pool.num_blocks

    def record_prefix_query(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_stats.queries += num_prompt_tokens
        self.prefix_stats.hits += num_hit_tokens

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_cache()
