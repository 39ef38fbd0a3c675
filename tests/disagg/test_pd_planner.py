"""The elastic P:D planner on a synthetic queue trace: moves towards the pool under pressure, only
after `patience` intervals, never within the cooldown, never emptying a pool."""
from __future__ import annotations

import pytest

from tokenmill.disagg.planner import Planner, PlannerConfig, pick_mover, wanted_move
from tokenmill.disagg.policy import InstanceState

CFG = PlannerConfig(high_queue=2.0, low_queue=0.5, patience=3, cooldown=2)


def pools(p_waiting: list[int], d_waiting: list[int], kv: float = 0.1):
    return ([InstanceState(f"p{i}", "prefill", num_waiting=w) for i, w in enumerate(p_waiting)],
            [InstanceState(f"d{i}", "decode", num_waiting=w, kv_usage=kv) for i, w in enumerate(d_waiting)])


def test_wanted_move_follows_the_pressure():
    assert wanted_move(*pools([5], [0, 0]), CFG).move == +1
    assert wanted_move(*pools([0, 0], [4]), CFG).move == -1
    assert wanted_move(*pools([5], [4]), CFG).move == 0  # both busy: moving would only shift the queue
    assert wanted_move(*pools([5], [0]), CFG).move == 0  # the decode pool keeps one instance
    assert wanted_move(*pools([0, 0], [0], kv=0.95), CFG).move == -1  # a full KV cache is decode pressure


def test_hysteresis_and_cooldown_on_a_trace():
    """Prefill pressure for 6 intervals, then a burst of decode pressure, then calm."""
    planner = Planner(CFG)
    p, d = pools([0], [0, 0, 0])
    trace = [(6, 0)] * 6 + [(0, 6)] * 6 + [(0, 0)] * 3
    moves = []
    for t, (pw, dw) in enumerate(trace):
        for inst in p:
            inst.num_waiting = pw
        for inst in d:
            inst.num_waiting = dw
        decision = planner.step(p, d)
        if decision.move == +1:
            i = pick_mover(d)
            p.append(d.pop(i))
        elif decision.move == -1:
            i = pick_mover(p)
            d.append(p.pop(i))
        moves.append(decision.move)
        assert "waiting" in decision.reason or decision.move or "balanced" in decision.reason
    # third interval of prefill pressure: move; cooldown 2 intervals; a streak restarts after it
    assert moves[:6] == [0, 0, +1, 0, 0, +1]
    assert moves[6:12] == [0, 0, -1, 0, 0, -1]
    assert moves[12:] == [0, 0, 0]
    assert len(p) == 1 and len(d) == 3


def test_a_flapping_signal_never_moves():
    planner = Planner(CFG)
    p, d = pools([0], [0, 0])
    for t in range(20):
        p[0].num_waiting = 6 if t % 2 else 0
        assert planner.step(p, d).move == 0


def test_config_is_checked():
    with pytest.raises(ValueError, match="low_queue"):
        PlannerConfig(high_queue=1.0, low_queue=2.0)


def test_router_applies_moves_and_exports_them():
    from tokenmill.disagg.policy import RouterConfig
    from tokenmill.disagg.router import Router
    router = Router(["http://p0"], ["http://d0", "http://d1"], [], RouterConfig())
    router.enable_planner(PlannerConfig(high_queue=2.0, low_queue=0.5, patience=2, cooldown=0))
    router.prefills[0].num_waiting = 5
    assert router.plan().move == 0 and router.plan().move == +1
    assert [i.url for i in router.prefills] == ["http://p0", "http://d0"] and router.prefills[1].role == "prefill"
    assert router.decisions[-1]["to"] == "prefill" and "prefill waiting 5.0" in router.decisions[-1]["reason"]
    from prometheus_client import generate_latest
    text = generate_latest(router.registry).decode()
    assert 'tokenmill:planner_role_changes_total{to="prefill"} 1.0' in text
    assert 'tokenmill:planner_instances{role="decode"} 1.0' in text


def test_core_shares():
    from tokenmill.disagg.cluster import core_shares
    assert core_shares([0, 1], 2) == [[0], [1]]
    assert core_shares([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert core_shares([0, 1], 3) == [[0], [1], [0]]
