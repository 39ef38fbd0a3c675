"""The planner's search on a synthetic cost surface with a planted optimum, and SLO parsing."""
import itertools

import pytest

from tokenmill.sim.planner import Evaluation, cheapest_units, parse_slo, search


def test_finds_the_planted_optimum():
    """Structure (a, b, c): capacity per unit and price per unit from a bumpy surface; a
    configuration meets the SLO when units x capacity covers the demand. The planted structure is
    the only one whose cheapest feasible point is cheaper than every other's; the search must find
    it, with its exact minimal unit count."""
    demand = 37.0
    planted = (2, 1, 3)

    def capacity(s):
        a, b, c = s
        return 1.0 + a + 0.5 * b + (c % 2) * 0.7

    def price(s):
        a, b, c = s
        base = 1.0 + 0.9 * a + 0.6 * b + 0.3 * c + 0.25 * ((a * 7 + b * 3 + c) % 4)
        return base * (0.55 if s == planted else 1.0)

    calls = []

    def evaluate(s, n):
        calls.append((s, n))
        return Evaluation(s, n, n * price(s), n * capacity(s) >= demand)

    structs = list(itertools.product(range(4), range(3), range(5)))
    best, everything = search(structs, evaluate, max_units=64)
    brute = min(((s, n) for s in structs for n in range(1, 65) if n * capacity(s) >= demand),
                key=lambda sn: sn[1] * price(sn[0]))
    assert (best[0].structure, best[0].units) == brute
    assert best[0].structure == planted
    assert best[0].units == int(-(-demand // capacity(planted)))
    assert len(calls) <= len(structs) * 2 * 7  # doubling + bisection, not a scan of 64 counts
    assert all(best[i].price_per_hour <= best[i + 1].price_per_hour for i in range(len(best) - 1))


def test_infeasible_structure_is_left_out():
    found, evals = cheapest_units("x", lambda s, n: Evaluation(s, n, n, False), max_units=8)
    assert found is None and [e.units for e in evals] == [1, 2, 4, 8]


def test_parse_slo():
    terms = parse_slo("ttft_p99<=2s, tpot_p99 <= 100ms,e2e_p50<=30s")
    assert [(t.metric, t.percentile, t.limit_ms) for t in terms] == [("ttft", 99, 2000), ("tpot", 99, 100),
                                                                     ("e2e", 50, 30000)]
    assert terms[0].key == "ttft_ms.p99"
    for bad in ("ttft<=2s", "ttft_p99<2s", "latency_p99<=2s", "ttft_p99<=2h", ""):
        with pytest.raises(ValueError, match="--slo"):
            parse_slo(bad)
