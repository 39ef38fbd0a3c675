"""The profile-driven P:D planner on fake profiles and synthetic traces: closed-form sizing,
correction by measured/expected latency, the split, hysteresis; a planted load shift moves the
split the right way, a steady (noisy) load never makes it oscillate."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.disagg.planner import pick_mover
from tokenmill.disagg.policy import InstanceState
from tokenmill.disagg.role_profile import DecodeCurve, PrefillCurve, RoleProfile
from tokenmill.disagg.sla_planner import (Corrections, Demand, IntervalLoad, ProfilePlanner, SLAPlannerConfig,
                                          correct, demand, predict, target_prefill)

# prefill: 1000 prompt tokens/s (TTFT = ISL / 1000 s); decode: ITL = 10 ms + 1 ms per extra request
PROFILE = RoleProfile(PrefillCurve((1.0, 10000.0), (0.001, 10.0)),
                      DecodeCurve((1.0, 10000.0), (1.0, 1001.0), ((0.01, 1.01), (0.01, 1.01)), kv_tokens=1e9,
                                  max_batch=1000))
CFG = SLAPlannerConfig(ttft_target_s=1e9, itl_target_s=0.05, min_prefill=1, patience=2, cooldown=1)


def load(remote_rps: float = 0.0, local_rps: float = 0.0, remote_isl: int = 1000, local_isl: int = 100,
         osl: int = 50, interval_s: float = 10.0, ttft_s: float | None = None, itl_s: float | None = None,
         batch: float = 1.0) -> IntervalLoad:
    nr, nl = round(remote_rps * interval_s), round(local_rps * interval_s)
    ttfts = ((remote_isl, ttft_s),) * nr if ttft_s is not None else ()
    return IntervalLoad(interval_s, nr + nl, nr, nr * remote_isl, nl * local_isl, (nr + nl) * osl, ttfts, itl_s,
                        batch)


def pools(p: int, d: int) -> tuple[list[InstanceState], list[InstanceState]]:
    return ([InstanceState(f"p{i}", "prefill") for i in range(p)], [InstanceState(f"d{i}", "decode") for i in range(d)])


def test_sizing_is_closed_form():
    pred = predict(None, load(remote_rps=2.0, osl=41), CFG.smoothing)
    assert pred.remote_tok_s == pytest.approx(2000) and pred.output_tok_s == pytest.approx(82)
    dem = demand(pred, Corrections(), PROFILE, CFG)
    assert dem.prefill_capacity == pytest.approx(1000, rel=1e-3)  # no queueing derate under a huge TTFT target
    assert dem.prefill == pytest.approx(2.0, rel=1e-3)
    # decode: the largest batch with 10 ms + 1 ms x (b - 1) <= 50 ms is 41, so 41 / 0.05 = 820 tok/s per engine
    assert dem.decode_capacity == pytest.approx(820, rel=1e-3)
    assert dem.decode == pytest.approx(82 / 820, rel=1e-3)


def test_the_ttft_target_derates_prefill_capacity():
    curve = PROFILE.prefill
    assert curve.capacity(1000, 1e9) == pytest.approx(1000, rel=1e-3)
    assert curve.capacity(1000, 2.0) == pytest.approx(1000 * 2 / 3, rel=1e-3)  # M/D/1 with T = 2 S: rho = 2/3
    assert curve.capacity(1000, 0.5) == pytest.approx(100, rel=1e-3)  # out of reach: the 10% floor


def test_kv_capacity_bounds_the_decode_batch():
    small = DecodeCurve((1.0, 10000.0), (1.0, 1001.0), ((0.01, 1.01), (0.01, 1.01)), kv_tokens=10000)
    assert small.capacity(1000, 0.05) == pytest.approx(10 / 0.019, rel=1e-3)  # 10 requests of 1000 tokens fit


def test_corrections_follow_measured_over_expected():
    pred_load = load(remote_rps=1.0, ttft_s=2.0, itl_s=0.03, batch=1.0, local_rps=0.0, osl=50)
    c = correct(Corrections(), pred_load, PROFILE, CFG)
    assert c.prefill == pytest.approx(2.0, rel=1e-3)  # expected TTFT at ISL 1000: 1 s
    assert c.decode == pytest.approx(3.0, rel=1e-3)  # expected ITL at batch 1: 10 ms
    assert correct(c, load(remote_rps=1.0), PROFILE, CFG) == c  # no samples: keep the factors
    assert correct(Corrections(), load(remote_rps=1.0, ttft_s=100.0), PROFILE, CFG).prefill == CFG.max_correction
    pred = predict(None, pred_load, 0.5)
    slow, plain = demand(pred, c, PROFILE, CFG), demand(pred, Corrections(), PROFILE, CFG)
    assert slow.decode > plain.decode  # a 3x slower ITL: a tighter target, less per engine
    assert slow.prefill == pytest.approx(plain.prefill)  # TTFT over the profile (queueing): not counted twice
    quick = demand(pred, Corrections(prefill=0.5), PROFILE, CFG)  # faster than profiled (prefix hits)
    assert quick.prefill == pytest.approx(plain.prefill / 2)
    uncapped = SLAPlannerConfig(ttft_target_s=1e9, itl_target_s=0.05, max_prefill_correction=4.0)
    assert demand(pred, c, PROFILE, uncapped).prefill == pytest.approx(2 * plain.prefill)


def test_ttft_correction_weighs_each_request_by_its_own_isl():
    """A long prompt and a short one: expected 1 s + 0.1 s; measured 2.2 s in all: x2 (the mean
    ISL's TTFT, 0.55 s, would have said x2 too here, but not with a short prompt alone)."""
    lo = IntervalLoad(10.0, 2, 1, 1000, 100, 0, ((1000, 2.0), (100, 0.2)))
    assert correct(Corrections(), lo, PROFILE, CFG).prefill == pytest.approx(2.0, rel=1e-3)
    only_short = IntervalLoad(10.0, 2, 1, 1000, 100, 0, ((100, 0.1),))  # the long one's first token comes later
    assert correct(Corrections(), only_short, PROFILE, CFG).prefill == pytest.approx(1.0, rel=1e-3)


def test_target_split():
    cfg = SLAPlannerConfig(min_prefill=0, margin=0.25)
    assert target_prefill(1, 2, Demand(0.1, 1.5, 1, 1), cfg)[0] == 0  # tiny prefill demand: colocate
    assert target_prefill(0, 2, Demand(0.5, 0.5, 1, 1), cfg)[0] == 0  # under colocate_above: stay colocated
    assert target_prefill(0, 2, Demand(0.7, 0.5, 1, 1), cfg)[0] == 1
    assert target_prefill(1, 4, Demand(1.2, 2.0, 1, 1), cfg)[0] == 1  # still fits within the margin
    assert target_prefill(1, 4, Demand(1.6, 2.0, 1, 1), cfg)[0] == 2  # needs 2P+2D
    assert target_prefill(3, 4, Demand(1.0, 2.5, 1, 1), cfg)[0] == 1  # needs 1P+3D
    t, why = target_prefill(1, 4, Demand(6.0, 2.0, 1, 1), cfg)
    assert t == 3 and "proportional" in why  # overload: 4 x 6/8 = 3
    assert target_prefill(2, 4, Demand(5.0, 4.0, 1, 1), cfg)[0] == 2  # ideal 2.2: within the dead band


def run_trace(planner: ProfilePlanner, trace: list[IntervalLoad], p: int, d: int) -> tuple[list[int], list[int]]:
    prefills, decodes = pools(p, d)
    moves, sizes = [], []
    for lo in trace:
        dec = planner.step(prefills, decodes, lo)
        if dec.move > 0:
            prefills.append(decodes.pop(pick_mover(decodes)))
        elif dec.move < 0:
            decodes.append(prefills.pop(pick_mover(prefills)))
        moves.append(dec.move)
        sizes.append(len(prefills))
        assert decodes and len(prefills) >= planner.cfg.min_prefill
    return moves, sizes


def test_a_planted_load_shift_moves_the_split_the_right_way():
    """4 engines at 1P+3D: decode-heavy load, then long prompts (prefill-heavy), then back."""
    decode_heavy = load(remote_rps=0.3, local_rps=20, local_isl=50, osl=100, itl_s=0.012)  # 0.3 P, ~3 D
    prefill_heavy = load(remote_rps=2.5, local_rps=1, osl=20, itl_s=0.012)  # 2.5 P, ~0.1 D
    planner = ProfilePlanner(CFG, PROFILE)
    moves, sizes = run_trace(planner, [decode_heavy] * 6 + [prefill_heavy] * 10 + [decode_heavy] * 12, 1, 3)
    assert sizes[5] == 1  # settled on 1P+3D: no move
    assert set(moves[:6]) == {0}
    assert sizes[15] == 3 and all(m >= 0 for m in moves[6:16])  # towards prefill, one engine at a time
    assert sizes[-1] == 1 and all(m <= 0 for m in moves[16:])
    assert all(abs(a - b) <= 1 for a, b in zip(sizes, sizes[1:]))
    first_move = moves.index(1)
    assert first_move >= 6 + CFG.patience - 1  # hysteresis: not before `patience` intervals ask


def test_colocates_when_prefill_demand_is_small():
    cfg = SLAPlannerConfig(ttft_target_s=1e9, itl_target_s=0.05, min_prefill=0, patience=1, cooldown=0)
    moves, sizes = run_trace(ProfilePlanner(cfg, PROFILE), [load(local_rps=10, osl=100)] * 3, 1, 1)
    assert sizes == [0, 0, 0] and moves[0] == -1


def test_idle_intervals_ask_for_nothing():
    planner = ProfilePlanner(SLAPlannerConfig(patience=1, cooldown=0), PROFILE)
    assert run_trace(planner, [IntervalLoad(5.0)] * 5, 1, 1)[0] == [0] * 5


@settings(max_examples=150, deadline=None)
@given(n=st.integers(2, 6), p0=st.integers(0, 5), remote=st.floats(0.0, 6.0), local=st.floats(0.0, 40.0),
       osl=st.integers(1, 400), noise=st.lists(st.floats(0.9, 1.1), min_size=60, max_size=60),
       min_prefill=st.sampled_from([0, 1]))
def test_steady_load_never_oscillates(n, p0, remote, local, osl, noise, min_prefill):
    """A steady load (within +-10%) moves the split one way at most (no A -> B -> A), by one engine a
    step, and keeps every pool's floor."""
    p0 = min(max(p0, min_prefill), n - 1)
    cfg = SLAPlannerConfig(ttft_target_s=1e9, itl_target_s=0.05, min_prefill=min_prefill, patience=2, cooldown=1)
    trace = [load(remote_rps=remote * x, local_rps=local * x, osl=osl) for x in noise]
    moves, _ = run_trace(ProfilePlanner(cfg, PROFILE), trace, p0, n - p0)
    directions = {m for m in moves if m}
    assert len(directions) <= 1, moves


def test_config_is_checked():
    with pytest.raises(ValueError, match="colocate_below"):
        SLAPlannerConfig(colocate_below=0.8, colocate_above=0.5)
    with pytest.raises(ValueError, match="margin"):
        SLAPlannerConfig(margin=0.6)


def test_router_runs_the_profile_planner_and_exports_it():
    from prometheus_client import generate_latest

    from tokenmill.disagg.policy import RouterConfig
    from tokenmill.disagg.router import Router
    router = Router(["http://p0"], ["http://d0"], [], RouterConfig(min_remote_prefill_tokens=256))
    router.enable_planner(SLAPlannerConfig(patience=1, cooldown=0, itl_target_s=0.05), PROFILE)
    for _ in range(20):  # short prompts only: nothing a prefill engine could take
        router.window.record_request(100, remote=False)
    router.window.record_ttft(100, 0.2)  # expected TTFT at ISL 100: 0.1 s
    router.decodes[0].generation_tokens = 500.0
    d = router.plan()
    assert d.move == -1 and router.prefills == [] and [i.url for i in router.decodes] == ["http://d0", "http://p0"]
    assert router.decodes[1].role == "decode" and "colocate" in router.decisions[-1]["reason"]
    assert router.decisions[-1]["queues"] == {"prefill": [0], "decode": [0]}
    text = generate_latest(router.registry).decode()
    assert 'tokenmill:planner_role_changes_total{to="decode"} 1.0' in text
    assert 'tokenmill:planner_instances{role="prefill"} 0.0' in text
    assert 'tokenmill:planner_correction{role="prefill"} 2.0' in text
    with pytest.raises(ValueError, match="role profile"):
        router.enable_planner(SLAPlannerConfig())
