"""The load-aware latency model: it recovers a line from noisy observations, never predicts less
latency for more load, and moves the router's prediction as soon as the pool's in-flight count
rises (before any slow request has finished), where the moving average still says "fast"."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.fleet.config import parse_fleet_config
from tokenmill.fleet.latency_model import LoadLatencyModel
from tokenmill.fleet.policy import Targets, choose_pool
from tokenmill.fleet.replica import ReplicaProcess
from tokenmill.fleet.router import PoolRuntime, Router


def test_fits_a_line_from_noisy_observations():
    rng = random.Random(0)
    m = LoadLatencyModel()
    for _ in range(400):
        n = rng.randint(1, 8)
        m.observe(n, 0.05 + 0.1 * n + rng.gauss(0, 0.01))
    a, b = m.coefficients()
    assert a == pytest.approx(0.05, abs=0.03) and b == pytest.approx(0.1, abs=0.01)
    assert m.predict(10) == pytest.approx(1.05, abs=0.1)


def test_without_spread_it_is_flat_below_and_proportional_above():
    m = LoadLatencyModel()
    assert m.predict(3) is None
    for _ in range(10):
        m.observe(2, 0.4)
    assert m.coefficients() is None
    assert m.predict(1) == pytest.approx(0.4) and m.predict(4) == pytest.approx(0.8)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 16), st.floats(0.0, 10.0)), min_size=1, max_size=60),
       st.integers(1, 31))
def test_more_load_never_predicts_less_latency(observations, n):
    m = LoadLatencyModel()
    for x, y in observations:
        m.observe(x, y)
    assert m.predict(n + 1) >= m.predict(n) - 1e-9 >= -1e-9


def _router(prediction: str) -> Router:
    cfg = parse_fleet_config({
        "pools": [{"name": "economy", "model": "m", "max_concurrency": 8, "hardware": {"name": "c", "price_per_hour": 0.5}},
                  {"name": "premium", "model": "m", "max_concurrency": 8, "hardware": {"name": "p", "price_per_hour": 4}}],
        "slo_classes": {"interactive": {"ttft_ms": 500}}, "tenants": {"a": {"api_key": "A", "slo_class": "interactive"}},
        "latency_prediction": prediction})
    pools = []
    for p in cfg.pools:
        replica = ReplicaProcess(p, 0, Path("/nonexistent"), port=1)
        replica.healthy = True
        pools.append(PoolRuntime(p, [replica]))
    return Router(cfg, pools)


@pytest.mark.parametrize("prediction", ["load", "ewma"])
def test_a_loaded_cheap_pool_stops_getting_interactive_traffic_at_once(prediction):
    router = _router(prediction)
    economy = router.pools["economy"]
    for n in (1, 2, 3, 1, 2, 3, 1, 2, 3):  # history: TTFT 150 ms per request in flight
        economy.observe(0.15 * n, None, 1.0, load=n)
    economy.in_flight["economy-0"] = 5  # batch has just filled it: a new request would be the 6th
    d = choose_pool("m", Targets(0.5), router.loads())
    # the load model predicts ~0.9 s and sends it to premium; the moving average (~0.3 s) still says economy
    assert d.pool == ("premium" if prediction == "load" else "economy")
