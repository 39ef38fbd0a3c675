"""Block manager and scheduler invariants (torch-free): no leaks, refcounts never negative, prefix
hashes chained, and a scheduler driven by random traffic never over-allocates."""
import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.core.dry_run import DryRunExecutor
from tokenmill.core.engine_core import EngineCore
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams


def _req(rid: str, tokens: list[int], max_tokens: int = 4) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens), eos_token_id=None, max_tokens=max_tokens)


def check_invariants(kv: KVCacheManager) -> None:
    pool = kv.pool
    held: dict[int, int] = {}
    for blocks in kv.req_blocks.values():
        for b in blocks:
            held[b.block_id] = held.get(b.block_id, 0) + 1
    for b in pool.blocks:
        assert b.ref_cnt >= 0
        assert b.ref_cnt == held.get(b.block_id, 0), "refcount differs from the references held"
        assert (b.ref_cnt == 0) == (b.block_id in pool.free_queue), "free iff unreferenced"
    for h, b in pool.cached.items():
        assert b.block_hash == h


def test_chained_hash_differs_when_an_earlier_block_differs():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    a = _req("a", [1, 2, 3, 4, 9, 9, 9, 9, 5])
    b = _req("b", [7, 7, 7, 7, 9, 9, 9, 9, 5])  # second block equal, first differs
    ha, hb = kv.block_hashes(a, 8), kv.block_hashes(b, 8)
    assert a.all_token_ids[4:8] == b.all_token_ids[4:8] and ha[1] != hb[1]
    assert kv.allocate_slots(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    kv.cache_blocks(a, a.num_tokens)
    blocks, n = kv.get_computed_blocks(b)
    assert n == 0 and blocks == []
    c = _req("c", [1, 2, 3, 4, 9, 9, 9, 9, 6, 6])
    blocks, n = kv.get_computed_blocks(c)
    assert n == 8 and [x.block_id for x in blocks] == kv.block_ids("a")[:2]


def test_extra_key_separates_caches():
    kv1 = KVCacheManager(num_blocks=4, block_size=2, extra_key="int8")
    kv2 = KVCacheManager(num_blocks=4, block_size=2, extra_key="auto")
    r = _req("r", [1, 2, 3])
    assert kv1.block_hashes(r, 2) != kv2.block_hashes(_req("s", [1, 2, 3]), 2)


def test_at_least_one_token_is_computed_on_full_hit():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(8)))
    kv.allocate_slots(a, 8)
    kv.cache_blocks(a, 8)
    kv.free(a)
    blocks, n = kv.get_computed_blocks(_req("b", list(range(8))))
    assert n == 4  # 8 tokens cached, but the last block is left to compute for logits


def test_blocks_are_findable_only_once_their_kv_is_written():
    """Allocation reserves slots; a block is offered to the prefix cache only after the step that
    computes it (or a transfer that lands), so nobody can adopt KV that is not there yet."""
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(10)))
    assert kv.allocate_slots(a, 10)
    assert kv.get_computed_blocks(_req("b", list(range(10))))[1] == 0 and not kv.pool.cached
    kv.cache_blocks(a, 5)  # one full block computed
    assert kv.get_computed_blocks(_req("c", list(range(10))))[1] == 4
    kv.cache_blocks(a, 10)
    assert kv.get_computed_blocks(_req("d", list(range(10))))[1] == 8


def test_lookahead_slots_are_allocated_but_never_cached():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(4)))
    assert kv.allocate_slots(a, 4, num_lookahead_tokens=3)
    assert len(kv.block_ids("a")) == 2  # 4 known tokens + 3 speculative slots
    kv.cache_blocks(a, 4 + 3)  # more than the known tokens: only the known full block is cached
    assert len(kv.pool.cached) == 1


def test_lru_eviction_and_reuse_of_freed_cached_blocks():
    kv = KVCacheManager(num_blocks=4, block_size=2, watermark=0)
    a = _req("a", [1, 2, 3, 4, 5])
    assert kv.allocate_slots(a, 5)
    kv.cache_blocks(a, 5)
    kv.free(a)
    assert len(kv.pool.cached) == 2 and kv.pool.num_free_blocks == 4
    b = _req("b", [1, 2, 3, 4, 8])
    blocks, n = kv.get_computed_blocks(b)
    assert n == 4
    assert kv.allocate_slots(b, 1, blocks, admit=True)
    check_invariants(kv)
    assert kv.pool.num_free_blocks == 1  # b holds its 2 cached blocks + 1 new one
    c = _req("c", [9, 9, 9])  # needs 2 blocks
    assert kv.allocate_slots(c, 3) is False
    check_invariants(kv)


def test_blocks_without_a_cached_prefix_are_reused_first():
    kv = KVCacheManager(num_blocks=6, block_size=2, watermark=0)
    a = _req("a", [1, 2, 3, 4, 5])  # 2 full blocks (cached) + 1 partial one (never cached)
    assert kv.allocate_slots(a, 5)
    kv.cache_blocks(a, 5)
    ids = [b.block_id for b in kv.req_blocks["a"]]
    kv.free(a)
    check_invariants(kv)
    # the partial block comes back first (its memory is warm); the cached ones are evicted last
    assert kv.pool.allocate(1)[0].block_id == ids[2]
    assert [b.block_id for b in kv.pool.allocate(3)] == [3, 4, 5]
    assert len(kv.pool.cached) == 2 and kv.pool.num_free_blocks == 2


class CheckingExecutor(DryRunExecutor):
    """A model-less executor that also checks what the plain SchedulerOutput promises: every
    scheduled request's blocks cover its computed plus new tokens, and no live Request crosses."""

    def __init__(self, kv: KVCacheManager) -> None:
        super().__init__()
        self.kv = kv
        self.block_ids: dict[str, list[int]] = {}

    def execute(self, out):
        for rid in (*out.finished_request_ids, *out.preempted_request_ids):
            self.block_ids.pop(rid, None)
        computed = {}
        for new in out.new_requests:
            self.block_ids[new.request_id] = list(new.block_ids)
            computed[new.request_id] = new.num_computed_tokens
        for c in out.cached_requests:
            self.block_ids[c.request_id] += c.new_block_ids
            computed[c.request_id] = c.num_computed_tokens
        for rid, k in out.num_scheduled_tokens.items():
            assert self.block_ids[rid] == self.kv.block_ids(rid), "the executor's block table drifted"
            assert len(self.block_ids[rid]) * self.kv.block_size >= computed[rid] + k
        assert not any(isinstance(v, Request) for v in _walk(out))
        return super().execute(out)


def _walk(obj):
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _walk(getattr(obj, f.name))
    elif isinstance(obj, (list, tuple, set)):
        for x in obj:
            yield from _walk(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _walk(x)
    else:
        yield obj


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "step", "step", "step", "abort"]),
                              st.integers(0, 3), st.integers(1, 30), st.integers(1, 8)),
                    min_size=1, max_size=60),
       num_blocks=st.integers(8, 40), block_size=st.sampled_from([1, 2, 4, 8]),
       budget=st.integers(1, 64), caching=st.booleans(), lookahead=st.integers(0, 3))
def test_random_traffic_never_leaks(ops, num_blocks, block_size, budget, caching, lookahead):
    """Random adds, steps and aborts through the real EngineCore: refcounts always match the
    references held, nothing leaks, every request finishes, and only blocks whose KV was computed
    are findable by hash."""
    kv = KVCacheManager(num_blocks, block_size, enable_caching=caching)
    core = EngineCore(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=10_000,
                                      num_lookahead_tokens=lookahead), kv, CheckingExecutor(kv))
    prefixes = [[1] * 12, [2] * 12, [1] * 6 + [3] * 6, []]
    live: list[str] = []
    n = 0
    for op, pfx, length, max_tokens in ops:
        if op == "add":
            tokens = (prefixes[pfx] + list(range(100 + n, 100 + n + length)))[: max(1, length + 6)]
            if -(-(len(tokens) + max_tokens + lookahead) // block_size) > num_blocks:
                continue
            core.add_request(_req(str(n), tokens, max_tokens))
            live.append(str(n))
            n += 1
        elif op == "abort" and live:
            core.finish_requests([live.pop(pfx % len(live))])
        else:
            _step(core, live)
        check_invariants(kv)
        assert kv.pool.num_used_blocks <= num_blocks
    for _ in range(2000):
        if not core.has_unfinished_requests():
            break
        _step(core, live)
        check_invariants(kv)
    assert not core.has_unfinished_requests(), "scheduler stalled"
    assert kv.pool.num_free_blocks == num_blocks and not kv.req_blocks


def _step(core: EngineCore, live: list[str]) -> None:
    for out in core.step().outputs:
        if out.finish_reason is not None:
            live.remove(out.request_id)
    for req in core.scheduler.running:  # cached blocks hold computed tokens only
        for i, b in enumerate(core.kv.req_blocks.get(req.request_id, [])):
            if b.block_hash is not None:
                assert (i + 1) * core.kv.block_size <= req.num_computed_tokens, (i, req)
