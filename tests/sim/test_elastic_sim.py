"""The profile planner inside the simulator (sim/elastic.py): the same `ProfilePlanner` as
`tokenmill cluster`, on simulated replicas of the shipped CPU profile. A planted load shift (short
prompts with long outputs, then long prompts with short outputs, then back) moves the split towards
prefill and back; every request completes with all its tokens; hand-offs still finish on a replica
moved out of the prefill pool (every long prompt is handed over)."""
from __future__ import annotations

import random

from tokenmill.disagg.role_profile import role_profile_from_sim
from tokenmill.disagg.sla_planner import ProfilePlanner, SLAPlannerConfig
from tokenmill.sim.cluster import ClusterConfig, build_cluster
from tokenmill.sim.elastic import ElasticClusterSimulator
from tokenmill.sim.hardware import load_profile
from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.simulator import SimRequest


def phase(rng: random.Random, t0: float, seconds: float, rate: float, isl: int, osl: int, tag: str) -> list[SimRequest]:
    out, t = [], t0
    while True:
        t += rng.expovariate(rate)
        if t >= t0 + seconds:
            return out
        out.append(SimRequest(f"{tag}{len(out)}", t, [rng.randrange(3, 40000) for _ in range(isl)], osl))


def test_planted_shift_moves_the_simulated_split_and_back():
    profile = load_profile(None)
    shape = ModelShape(**profile["model_shape"])
    specs, link = build_cluster(ClusterConfig(prefill_replicas=1, decode_replicas=3, max_model_len=4096), shape,
                                profile=profile)
    cfg = SLAPlannerConfig(interval_s=2.0, ttft_target_s=3.0, itl_target_s=0.1, min_prefill=1, patience=2, cooldown=1)
    planner = ProfilePlanner(cfg, role_profile_from_sim(profile))
    rng = random.Random(0)
    requests = (phase(rng, 0, 24, 3.0, 48, 96, "a") + phase(rng, 24, 24, 1.2, 1024, 4, "b")
                + phase(rng, 48, 40, 3.0, 48, 96, "c"))
    sim = ElasticClusterSimulator(specs, planner, link, min_remote_prefill_tokens=256)
    results = sim.run(requests)
    assert all(len(r.token_times) == r.output_len for r in results)
    prefill_at = {round(t): p for t, p, _ in sim.pool_sizes}
    assert max(p for t, p in prefill_at.items() if t <= 24) == 1  # decode-heavy: the prefill pool stays at 1
    assert max(p for t, p in prefill_at.items() if 24 < t <= 50) >= 2  # long prompts: it grows
    assert sim.pool_sizes[-1][1] == 1  # decode-heavy again: back to 1
    assert [m[2] for m in sim.moves].count("prefill") >= 1 and [m[2] for m in sim.moves].count("decode") >= 1
    for a, b in zip(sim.pool_sizes, sim.pool_sizes[1:]):
        assert abs(a[1] - b[1]) <= 1 and a[1] + a[2] == 4
    handed = [r for r in results if r.request_id.startswith("b")]
    assert all(len(r.replicas) == 2 for r in handed)  # long prompts: a prefill replica, then a decode one
