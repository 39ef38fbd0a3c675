"""The cluster simulator: routing, disaggregation, batching baselines, bad configurations."""
import pytest

from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.routing.policies import LeastLoaded, PrefixAware, RoundRobin, RouteRequest, make_policy
from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.perf_model import PerfCoefficients, PerfModel
from tokenmill.sim.simulator import ClusterSimulator, KVTransfer, ReplicaSpec, SimRequest

SHAPE = ModelShape("toy", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                   intermediate_size=128, vocab_size=1000)
# 1 ms per step + 1 ms per token: easy to reason about
COEFF = PerfCoefficients(linear_flops_per_s=1e30, attention_flops_per_s=1e30, mem_bytes_per_s=1e30,
                         step_overhead_s=0.001, per_token_s=0.001)


def _spec(role="unified", blocks=256, **kw):
    return ReplicaSpec(PerfModel(SHAPE, COEFF), SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=32),
                       blocks, 16, role=role, **kw)


def _req(rid, arrival, n=32, out=4, base=0):
    return SimRequest(rid, arrival, list(range(base, base + n)), out)


def test_single_request_latency_is_the_models_arithmetic():
    sim = ClusterSimulator([_spec()])
    [r] = sim.run([_req("a", 1.0, n=32, out=3)])
    # prefill step: 1 + 32 ms; then two decode steps of 1 + 1 ms
    assert r.ttft == pytest.approx(0.033)
    assert r.token_times == pytest.approx([1.033, 1.035, 1.037])


def test_round_robin_and_least_loaded_spread_requests():
    reqs = [_req(str(i), 0.0, base=100 * i) for i in range(6)]
    sim = ClusterSimulator([_spec()] * 3, "round-robin")
    assert [r.replicas[0] for r in sim.run(reqs)] == [0, 1, 2, 0, 1, 2]
    sim = ClusterSimulator([_spec()] * 3, "least-loaded")
    assert sorted(r.replicas[0] for r in sim.run(reqs)) == [0, 0, 1, 1, 2, 2]


def test_prefix_aware_routing_keeps_groups_together_and_hits_the_cache():
    prefix_a, prefix_b = list(range(500, 564)), list(range(600, 664))
    reqs = [SimRequest(str(i), 0.01 * i, (prefix_a if i % 2 else prefix_b) + [i], 2) for i in range(10)]
    sim = ClusterSimulator([_spec()] * 2, "prefix-aware")
    res = sim.run(reqs)
    by_group = {i % 2: {r.replicas[0] for j, r in enumerate(res) if j % 2 == i % 2} for i in range(2)}
    assert all(len(v) == 1 for v in by_group.values()) and by_group[0] != by_group[1]
    assert sum(r.num_cached_tokens for r in res) == 8 * 64
    spread = ClusterSimulator([_spec()] * 3, "round-robin").run(reqs)  # each group lands on all 3 replicas
    assert sum(r.num_cached_tokens for r in spread) < 8 * 64


def test_prefix_aware_falls_back_to_least_loaded_when_imbalanced():
    class Load:
        def __init__(self, n):
            self.num_running, self.num_waiting, self.kv_usage = n, 0, 0.0
    p = PrefixAware(block_size=4, max_imbalance=2)
    req = RouteRequest("x", list(range(8)))
    assert p.choose(req, [Load(0), Load(0)]) == 0
    assert p.choose(req, [Load(1), Load(0)]) == 0  # within the imbalance: the cache wins
    assert p.choose(req, [Load(5), Load(0)]) == 1
    with pytest.raises(ValueError, match="round-robin"):
        make_policy("random")
    assert isinstance(make_policy("least-loaded"), LeastLoaded) and isinstance(make_policy("round-robin"), RoundRobin)


def test_disaggregation_adds_the_kv_transfer_and_skips_decode_prefill_compute():
    link = KVTransfer(bytes_per_s=SHAPE.kv_bytes_per_token() * 1000, latency_s=0.002)  # 1 ms per token
    sim = ClusterSimulator([_spec("prefill"), _spec("decode")], transfer=link)
    [r] = sim.run([_req("a", 0.0, n=32, out=3)])
    assert r.replicas == [0, 1]
    assert r.ttft == pytest.approx(0.033)  # the prefill replica's first token
    # KV lands at 33 + 2 + 32 ms; the decode replica adopts 33 tokens, computing only the last one
    landed = 0.033 + 0.002 + 0.032
    assert r.token_times[1] == pytest.approx(landed + 0.002)
    assert r.token_times[2] == pytest.approx(landed + 0.004)
    with pytest.raises(ValueError, match="transfer"):
        ClusterSimulator([_spec("prefill"), _spec("decode")])
    with pytest.raises(ValueError, match="not a mix"):
        ClusterSimulator([_spec("prefill"), _spec()], transfer=link)


def test_without_continuous_batching_a_request_waits_for_the_batch():
    reqs = [_req("a", 0.0, out=10), _req("b", 0.005, out=2, base=100)]
    cont = {r.request_id: r for r in ClusterSimulator([_spec()]).run(reqs)}
    static = {r.request_id: r for r in ClusterSimulator([_spec(continuous_batching=False)]).run(reqs)}
    assert static["b"].token_times[0] > cont["a"].token_times[-1] - 1e-9 > cont["b"].token_times[0]


def test_a_request_larger_than_the_kv_cache_is_an_error():
    with pytest.raises(ValueError, match="more KV blocks"):
        ClusterSimulator([_spec(blocks=2)]).run([_req("a", 0.0, n=64)])


def test_each_phase_can_have_its_own_tensor_parallel_degree():
    from tokenmill.sim.cluster import ClusterConfig, build_cluster
    from tokenmill.sim.hardware import load_hardware

    hw = load_hardware()
    cfg = ClusterConfig(prefill_replicas=1, decode_replicas=2, tp=2, decode_tp=1, max_model_len=2048)
    assert cfg.num_devices == 4 and "TP2/1" in cfg.label()
    specs, _ = build_cluster(cfg, SHAPE, hw, "a100")
    assert [(s.role, s.perf.tp) for s in specs] == [("prefill", 2), ("decode", 1), ("decode", 1)]
    assert specs[0].price_per_hour == pytest.approx(2 * specs[1].price_per_hour)
    with pytest.raises(ValueError, match="decode_tp needs prefill and decode"):
        ClusterConfig(decode_tp=2)
