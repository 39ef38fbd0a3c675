"""The router policy on fake instance states: decode picked first by prefix overlap against load,
then conditional disaggregation (long uncached suffix, a receiving decode instance, a prefill
instance below the queue limit)."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokenmill.disagg.instances import parse_load
from tokenmill.disagg.policy import (InstanceState, RouterConfig, overlap_blocks, pick_decode, plan_route,
                                     prompt_block_hashes)
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams

BS, KEY = 16, "model|kv=auto"
CFG = RouterConfig(min_remote_prefill_tokens=256, max_prefill_queue=4)


def hashes(n_tokens: int, seed: int = 0) -> list[bytes]:
    return prompt_block_hashes([(seed * 7919 + i) % 30000 for i in range(n_tokens)], BS, KEY)


def test_hashes_are_the_engines_own():
    tokens = list(range(100))
    kv = KVCacheManager(16, BS, extra_key=KEY)
    req = Request("r", tokens, SamplingParams())
    assert prompt_block_hashes(tokens, BS, KEY) == kv.block_hashes(req, 96)


def test_overlap_is_a_leading_chain():
    h = hashes(64)
    assert overlap_blocks(h, set(h)) == 4
    assert overlap_blocks(h, {h[0], h[2], h[3]}) == 1  # block 1 missing: what follows is unusable
    assert overlap_blocks(h, set()) == 0


def test_decode_with_the_prefix_wins_unless_much_busier():
    h = hashes(1024)
    warm = InstanceState("a", "decode", cached=set(h[:60]), num_running=3)
    cold = InstanceState("b", "decode", num_running=2)
    assert pick_decode(h, [warm, cold], CFG) == (0, 60)
    warm.num_waiting = 20  # far busier: load outweighs the cache
    assert pick_decode(h, [warm, cold], CFG)[0] == 1
    warm.healthy = False
    assert pick_decode(h, [warm, cold], CFG)[0] == 1
    assert pick_decode(h, [warm, cold], CFG, exclude={1}) is None


def test_kv_usage_breaks_ties():
    h = hashes(100)
    a, b = InstanceState("a", "decode", kv_usage=0.9), InstanceState("b", "decode", kv_usage=0.1)
    assert pick_decode(h, [a, b], CFG)[0] == 1


def test_conditional_disaggregation():
    prefill = [InstanceState("p", "prefill")]
    d = InstanceState("d", "decode")
    long, short = hashes(2000), hashes(100)
    r = plan_route(2000, long, BS, [d], prefill, CFG)
    assert r.prefill == 0 and r.decode == 0
    assert plan_route(100, short, BS, [d], prefill, CFG).prefill is None  # short: the decode instance prefills
    d.cached = set(long[:120])  # 1920 of 2000 tokens cached on the decode instance: 80 left
    r = plan_route(2000, long, BS, [d], prefill, CFG)
    assert r.prefill is None and r.overlap_tokens == 1920
    d.cached = set()
    prefill[0].num_waiting = 4  # the prefill pool is the bottleneck: prefill locally
    assert plan_route(2000, long, BS, [d], prefill, CFG).prefill is None
    prefill[0].num_waiting = 0
    prefill[0].healthy = False
    assert plan_route(2000, long, BS, [d], prefill, CFG).prefill is None
    both = InstanceState("c", "both")
    assert plan_route(2000, long, BS, [both], [InstanceState("p", "prefill")], CFG).prefill is None  # cannot receive


def test_prefill_instance_by_overlap_then_load():
    h = hashes(2000)
    p0 = InstanceState("p0", "prefill", num_running=1)
    p1 = InstanceState("p1", "prefill", num_running=1, cached=set(h[:100]))
    assert plan_route(2000, h, BS, [InstanceState("d", "decode")], [p0, p1], CFG).prefill == 1
    p1.num_running = 12  # below the limit, but busier than its cache is worth (0.1 x 11 > 0.8 of the prompt)
    cfg = RouterConfig(min_remote_prefill_tokens=256, max_prefill_queue=16)
    assert plan_route(2000, h, BS, [InstanceState("d", "decode")], [p0, p1], cfg).prefill == 0


def test_router_in_flight_counts_when_scrapes_lag():
    a = InstanceState("a", "decode", in_flight=5)
    b = InstanceState("b", "decode", num_running=1)
    assert a.queue == 5 and pick_decode(hashes(50), [a, b], CFG)[0] == 1


@given(st.lists(st.tuples(st.integers(0, 10), st.integers(0, 10), st.floats(0, 1), st.booleans()),
                min_size=1, max_size=6), st.integers(1, 3000))
def test_a_decision_is_always_a_healthy_instance(states, n_tokens):
    h = hashes(n_tokens)
    decodes = [InstanceState(f"d{i}", "decode", healthy=ok, num_running=r, num_waiting=w, kv_usage=u)
               for i, (r, w, u, ok) in enumerate(states)]
    prefills = [InstanceState("p", "prefill", num_waiting=states[0][1])]
    r = plan_route(n_tokens, h, BS, decodes, prefills, CFG)
    if not any(d.healthy for d in decodes):
        assert r is None
        return
    assert decodes[r.decode].healthy
    if r.prefill is not None:
        assert n_tokens - r.overlap_tokens >= CFG.min_remote_prefill_tokens and prefills[0].queue < 4


def test_parse_load_reads_the_engine_gauges():
    text = ('# TYPE tokenmill:num_requests_running gauge\ntokenmill:num_requests_running{model_name="m"} 3.0\n'
            '# TYPE tokenmill:num_requests_waiting gauge\ntokenmill:num_requests_waiting{model_name="m"} 2.0\n'
            '# TYPE tokenmill:kv_cache_usage_perc gauge\ntokenmill:kv_cache_usage_perc{model_name="m"} 0.25\n')
    assert parse_load(text) == {"num_running": 3.0, "num_waiting": 2.0, "kv_usage": 0.25}
