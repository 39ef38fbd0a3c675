"""Block manager and scheduler invariants (torch-free): no leaks, refcounts never negative, prefix
hashes chained, and a scheduler driven by random traffic never over-allocates."""
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.scheduler import Scheduler, SchedulerConfig
from tokenmill.request import FinishReason, Request
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
    ha, hb = kv._block_hashes(a, 8), kv._block_hashes(b, 8)
    assert a.all_token_ids[4:8] == b.all_token_ids[4:8] and ha[1] != hb[1]
    assert kv.allocate_slots(a, a.num_tokens)
    a.num_computed_tokens = a.num_tokens
    blocks, n = kv.get_computed_blocks(b)
    assert n == 0 and blocks == []
    c = _req("c", [1, 2, 3, 4, 9, 9, 9, 9, 6, 6])
    blocks, n = kv.get_computed_blocks(c)
    assert n == 8 and [x.block_id for x in blocks] == kv.block_ids("a")[:2]


def test_extra_key_separates_caches():
    kv1 = KVCacheManager(num_blocks=4, block_size=2, extra_key="int8")
    kv2 = KVCacheManager(num_blocks=4, block_size=2, extra_key="auto")
    r = _req("r", [1, 2, 3])
    assert kv1._block_hashes(r, 2) != kv2._block_hashes(_req("s", [1, 2, 3]), 2)


def test_at_least_one_token_is_computed_on_full_hit():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(8)))
    kv.allocate_slots(a, 8)
    kv.free(a)
    blocks, n = kv.get_computed_blocks(_req("b", list(range(8))))
    assert n == 4  # 8 tokens cached, but the last block is left to compute for logits


def test_lru_eviction_and_reuse_of_freed_cached_blocks():
    kv = KVCacheManager(num_blocks=4, block_size=2, watermark=0)
    a = _req("a", [1, 2, 3, 4, 5])
    assert kv.allocate_slots(a, 5)
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


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "step", "step", "step", "abort"]),
                              st.integers(0, 3), st.integers(1, 30), st.integers(1, 8)),
                    min_size=1, max_size=60),
       num_blocks=st.integers(8, 40), block_size=st.sampled_from([1, 2, 4, 8]),
       budget=st.integers(1, 64), caching=st.booleans())
def test_random_traffic_never_leaks(ops, num_blocks, block_size, budget, caching):
    kv = KVCacheManager(num_blocks, block_size, enable_caching=caching)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=10_000), kv)
    prefixes = [[1] * 12, [2] * 12, [1] * 6 + [3] * 6, []]
    live: list[Request] = []
    n = 0
    for op, pfx, length, max_tokens in ops:
        if op == "add":
            tokens = (prefixes[pfx] + list(range(100 + n, 100 + n + length)))[: max(1, length + 6)]
            if not kv.can_ever_fit(len(tokens) + max_tokens):
                continue
            r = _req(str(n), tokens, max_tokens)
            n += 1
            sched.add_request(r)
            live.append(r)
        elif op == "abort" and live:
            r = live.pop(pfx % len(live))
            sched.finish_request(r, FinishReason.ABORT)
        else:
            _fake_step(sched, live)
        check_invariants(kv)
        assert kv.pool.num_used_blocks <= num_blocks
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        _fake_step(sched, live)
        check_invariants(kv)
    assert not sched.has_unfinished(), "scheduler stalled"
    assert kv.pool.num_free_blocks == num_blocks and not kv.req_blocks


def _fake_step(sched: Scheduler, live: list[Request]) -> None:
    out = sched.schedule()
    for req, k in out.scheduled:
        assert req.num_computed_tokens + k <= req.num_tokens
        assert len(out.block_ids[req.request_id]) * sched.kv.block_size >= req.num_computed_tokens + k
    sched.update_after_step(out)
    for req, _ in out.scheduled:
        if req.num_computed_tokens == req.num_tokens:
            req.append_token(sum(req.all_token_ids) % 50, 0.0)
            if req.num_output_tokens >= req.max_tokens:
                sched.finish_request(req, FinishReason.LENGTH)
                live.remove(req)
