"""Prefix caching end to end on the tiny model: it must never change outputs, never leak or corrupt
blocks, and its counters must add up. (Hash chaining itself: tests/test_kv_cache_manager.py.)"""
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kv_cache_manager import check_invariants

from tokenmill import LLM, SamplingParams
from tokenmill.engine.engine import LLMEngine
from tokenmill.request import RequestStatus

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.95, seed=7, ignore_eos=True)
BLOCK = 4


def _shared_prefix_prompts(seed: int = 0, n: int = 12) -> list[dict]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 500) for _ in range(k)] for k in (13, 24, 8)]
    return [{"prompt_token_ids": prefixes[i % 3] + [rng.randrange(3, 500) for _ in range(rng.randint(1, 9))]}
            for i in range(n)]


def _ids(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def _llm(tiny_llama, caching: bool, **kw) -> LLM:
    return LLM(str(tiny_llama), dtype=kw.pop("dtype", "float32"), block_size=BLOCK, num_kv_blocks=kw.pop("num_kv_blocks", 256),
               enable_prefix_caching=caching, **kw)


@pytest.fixture(scope="module")
def uncached(tiny_llama):
    return _llm(tiny_llama, False)


@pytest.mark.parametrize("dtype,kv_cache_dtype", [("float32", "auto"), ("float32", "int8"), ("bfloat16", "auto")])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_outputs_identical_with_caching_on_and_off(tiny_llama, uncached, params, dtype, kv_cache_dtype):
    """bfloat16: float32 activations over a bf16 KV cache; a fresh prompt's attention must see the
    bf16-rounded K/V a later cache hit reads, or hits would change outputs."""
    prompts = _shared_prefix_prompts()
    default = dtype == "float32" and kv_cache_dtype == "auto"
    off = uncached if default else _llm(tiny_llama, False, dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    expect = _ids(off.generate(prompts, params, use_tqdm=False))
    # a small token budget admits the batch over several steps: later prompts hit the prefix blocks
    # that earlier steps wrote (a block is findable only once its KV is computed)
    on = _llm(tiny_llama, True, dtype=dtype, kv_cache_dtype=kv_cache_dtype, max_num_batched_tokens=32)
    first = on.generate(prompts, params, use_tqdm=False)  # hits within the batch (shared prefixes)
    again = on.generate(prompts, params, use_tqdm=False)  # hits on the whole prompts' full blocks
    assert _ids(first) == expect and _ids(again) == expect
    assert sum(o.num_cached_tokens for o in first) > 0
    assert all(o.num_cached_tokens == (len(o.prompt_token_ids) - 1) // BLOCK * BLOCK for o in again)
    assert on.llm_engine.core.kv.pool.num_used_blocks == 0


def test_prefix_stats_queries_hits_evictions(tiny_llama):
    """4 blocks of 4 tokens. LRU order and tail-first freeing decide which cached block goes first."""
    llm = _llm(tiny_llama, True, num_kv_blocks=4)
    kv = llm.llm_engine.core.kv
    one = SamplingParams(max_tokens=1, temperature=0)
    a = list(range(10, 18))          # 2 full blocks
    b = list(range(100, 112))        # 3 full blocks, nothing shared with a
    out_a = llm.generate({"prompt_token_ids": a}, one, use_tqdm=False)[0]
    # a used blocks 0,1 and freed them tail first: free queue 2,3,1,0, with 0 and 1 cached
    assert (kv.prefix_stats.queries, kv.prefix_stats.hits, kv.pool.num_evictions) == (8, 0, 0)
    assert out_a.num_cached_tokens == 0 and len(kv.pool.cached) == 2
    llm.generate({"prompt_token_ids": b}, one, use_tqdm=False)
    # b takes blocks 2,3,1: a's second block (1) is evicted, its first block (0) survives
    assert (kv.prefix_stats.queries, kv.prefix_stats.hits, kv.pool.num_evictions) == (20, 0, 1)
    out_a2 = llm.generate({"prompt_token_ids": a}, one, use_tqdm=False)[0]
    # a again: hits its first block (4 tokens), recomputes the rest into block 1 (b's tail: evicted)
    assert out_a2.num_cached_tokens == 4
    assert (kv.prefix_stats.queries, kv.prefix_stats.hits, kv.pool.num_evictions) == (28, 4, 2)
    assert out_a2.outputs[0].token_ids == out_a.outputs[0].token_ids
    out_b2 = llm.generate({"prompt_token_ids": b}, one, use_tqdm=False)[0]
    # b again: its first two blocks (2, 3) survived; the last block is always recomputed
    assert out_b2.num_cached_tokens == 8
    assert (kv.prefix_stats.queries, kv.prefix_stats.hits) == (40, 12)


def test_reset_prefix_cache(tiny_llama):
    llm = _llm(tiny_llama, True)
    prompt = {"prompt_token_ids": list(range(20, 45))}
    first = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert llm.generate(prompt, GREEDY, use_tqdm=False)[0].num_cached_tokens == 24
    engine = llm.llm_engine
    engine.add_request("busy", {"prompt_token_ids": [5, 6, 7, 8, 9]}, GREEDY)
    engine.step()
    assert llm.reset_prefix_cache() is False  # a request holds blocks: refused, nothing dropped
    assert engine.core.kv.pool.cached
    engine.abort_request("busy")
    assert llm.reset_prefix_cache() is True
    assert not engine.core.kv.pool.cached and all(b.block_hash is None for b in engine.core.kv.pool.blocks)
    after = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert after.num_cached_tokens == 0 and after.outputs[0].token_ids == first.outputs[0].token_ids


def test_preempted_request_refinds_its_own_blocks(tiny_llama):
    """10 blocks of 4 tokens for two requests that need 7 + 9: the later one (b) is preempted; when it
    resumes, its full blocks are still cached and it adopts exactly those blocks again."""
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    prompts = [list(range(30, 38)), list(range(200, 216))]
    alone = [_ids(_llm(tiny_llama, False).generate({"prompt_token_ids": p}, params, use_tqdm=False))[0]
             for p in prompts]
    llm = _llm(tiny_llama, True, num_kv_blocks=10)
    engine = llm.llm_engine
    kv = engine.core.kv
    held_at_preemption: dict[str, list[int]] = {}
    resumed_hits: list[tuple[str, list[int], int]] = []
    preempt, lookup = engine.core.scheduler._preempt, kv.get_computed_blocks

    def spy_preempt(req, out):
        held_at_preemption.setdefault(req.request_id, kv.block_ids(req.request_id))
        return preempt(req, out)

    def spy_lookup(req):
        blocks, n = lookup(req)
        if req.status == RequestStatus.PREEMPTED:
            resumed_hits.append((req.request_id, [b.block_id for b in blocks], n))
        return blocks, n

    engine.core.scheduler._preempt, kv.get_computed_blocks = spy_preempt, spy_lookup
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert _ids(outs) == alone
    assert engine.core.scheduler.num_preemptions >= 1 and outs[1].metrics.num_preemptions >= 1
    assert resumed_hits, "the preempted request never came back"
    rid, block_ids, num_hit = resumed_hits[0]
    assert rid == outs[1].request_id and num_hit >= len(prompts[1])  # at least its whole prompt
    assert block_ids == held_at_preemption[rid][:len(block_ids)]
    assert kv.pool.num_free_blocks == kv.num_blocks and not kv.req_blocks


# -- stress: random arrivals, shared prefixes, aborts, preemption ---------------------------------
_PREFIXES = [[7] * 9, list(range(40, 52)), list(range(40, 46)) + [3] * 5, []]
_ALONE: dict[tuple, list[int]] = {}  # (prompt, seed) -> 6 tokens generated alone, caching off


def _alone(uncached: LLM, prompt: list[int], seed: int | None) -> list[int]:
    key = (tuple(prompt), seed)
    if key not in _ALONE:
        _ALONE[key] = _ids(uncached.generate({"prompt_token_ids": prompt}, _params(6, seed), use_tqdm=False))[0]
    return _ALONE[key]


def _params(max_tokens: int, seed: int | None) -> SamplingParams:
    if seed is None:
        return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, ignore_eos=True)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "add", "add", "step", "step", "abort"]),
                              st.integers(0, 3), st.integers(1, 10), st.integers(1, 6), st.booleans()),
                    min_size=12, max_size=40),
       num_blocks=st.integers(8, 16), budget=st.sampled_from([7, 16, 64]))
def test_stress_random_traffic_no_leak_no_corruption(tiny_llama, uncached, ops, num_blocks, budget):
    engine = LLMEngine(model=str(tiny_llama), dtype="float32", block_size=BLOCK, num_kv_blocks=num_blocks,
                       max_num_batched_tokens=budget, max_num_seqs=8)
    kv = engine.core.kv
    live: dict[str, tuple[list[int], int, int | None]] = {}
    finished: dict[str, list[int]] = {}
    n = 0

    def step():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0].token_ids
        check_invariants(kv)
        assert kv.pool.num_used_blocks <= num_blocks

    for op, pfx, suffix_len, max_tokens, seeded in ops:
        if op == "add":
            prompt = _PREFIXES[pfx] + [100 + (n * 7 + i) % 400 for i in range(suffix_len)]
            seed = n if seeded else None
            rid = engine.add_request(f"r{n}", {"prompt_token_ids": prompt}, _params(max_tokens, seed))
            live[rid] = (prompt, max_tokens, seed)
            n += 1
        elif op == "abort" and live:
            rid = sorted(live)[pfx % len(live)]
            engine.abort_request(rid)
            live.pop(rid)
            finished.pop(rid, None)
        else:
            step()
    for _ in range(500):
        if not engine.has_unfinished_requests():
            break
        step()
    assert not engine.has_unfinished_requests(), "engine stalled"
    assert kv.pool.num_free_blocks == num_blocks and not kv.req_blocks, "blocks leaked"
    for rid, (prompt, max_tokens, seed) in live.items():
        assert finished[rid] == _alone(uncached, prompt, seed)[:max_tokens], rid
