"""SLA-class routing on fake pool states: cheapest pool predicted to meet the targets, else the best
available; best effort only on idle capacity, waits, and is shed before classes with targets."""
from hypothesis import given
from hypothesis import strategies as st

from tokenmill.fleet.policy import (Action, PoolLoad, Reason, RouterLimits, Targets, batch_ceiling, choose_pool,
                                    hard_limit, predict_ttft, retry_after_s)

INTERACTIVE = Targets(ttft_s=1.5, tpot_s=0.25)
BATCH = Targets()


def pool(name, price, in_flight=0, ttft=None, tpot=None, service=None, model="m", replicas=1, conc=4):
    return PoolLoad(name, model, price, replicas, conc, in_flight, ttft, tpot, service)


def test_cheapest_pool_that_meets_the_targets():
    pools = [pool("premium", 4.0, ttft=0.1, tpot=0.02), pool("economy", 0.5, ttft=0.4, tpot=0.1)]
    d = choose_pool("m", INTERACTIVE, pools)
    assert (d.action, d.pool, d.reason) == (Action.ROUTE, "economy", Reason.CHEAPEST_MEETING_SLO)


def test_a_pool_too_slow_for_the_class_is_passed_over():
    pools = [pool("premium", 4.0, ttft=0.1, tpot=0.02), pool("economy", 0.5, ttft=0.4, tpot=0.3)]
    assert choose_pool("m", INTERACTIVE, pools).pool == "premium"  # economy's TPOT 300 ms > 250 ms


def test_queueing_delay_counts_in_the_prediction():
    # economy is full: 4 slots busy + 4 beyond => the next waits 5/4 service times of 2 s
    economy = pool("economy", 0.5, in_flight=8, ttft=0.4, tpot=0.1, service=2.0)
    assert abs(predict_ttft(economy) - (0.4 + 5 / 4 * 2.0)) < 1e-9
    d = choose_pool("m", INTERACTIVE, [pool("premium", 4.0, ttft=0.1, tpot=0.02), economy])
    assert d.pool == "premium" and d.reason == Reason.CHEAPEST_MEETING_SLO


def test_no_pool_meets_the_targets_best_available_wins():
    pools = [pool("premium", 4.0, ttft=2.0, tpot=0.02), pool("economy", 0.5, ttft=3.0, tpot=0.1)]
    d = choose_pool("m", INTERACTIVE, pools)
    assert (d.pool, d.reason) == ("premium", Reason.BEST_AVAILABLE) and d.predicted_ttft_s == 2.0


def test_unobserved_pools_are_predicted_to_meet_so_they_get_traffic():
    d = choose_pool("m", INTERACTIVE, [pool("premium", 4.0, ttft=0.1, tpot=0.02), pool("economy", 0.5)])
    assert d.pool == "economy"


def test_only_pools_of_the_model_and_with_replicas():
    pools = [pool("other", 0.1, model="x"), pool("dead", 0.2, replicas=0), pool("premium", 4.0)]
    assert choose_pool("m", INTERACTIVE, pools).pool == "premium"
    assert choose_pool("nope", INTERACTIVE, pools).reason == Reason.NO_POOL


def test_batch_takes_idle_capacity_on_the_cheapest_pool():
    d = choose_pool("m", BATCH, [pool("premium", 4.0), pool("economy", 0.5)])
    assert (d.action, d.pool, d.reason) == (Action.ROUTE, "economy", Reason.IDLE_CAPACITY)


def test_batch_leaves_the_reserve_and_waits():
    # 4 slots, reserve 25%: batch may fill 3; at 3 in flight it waits, interactive still gets the slot
    pools = [pool("economy", 0.5, in_flight=3)]
    assert batch_ceiling(pools[0], RouterLimits()) == 3
    d = choose_pool("m", BATCH, pools)
    assert (d.action, d.reason) == (Action.WAIT, Reason.NO_IDLE_CAPACITY)
    assert choose_pool("m", BATCH, pools, queue_has_room=False).reason == Reason.QUEUE_FULL
    assert choose_pool("m", INTERACTIVE, pools).action == Action.ROUTE


def test_shedding_order_under_rising_load():
    """As load rises on one pool of 4 slots (hard limit 8), batch stops first, interactive last."""
    limits = RouterLimits(reserve=0.25, overflow=1.0)
    seen = []
    for in_flight in range(0, 10):
        p = [pool("economy", 0.5, in_flight=in_flight, ttft=0.1, tpot=0.01, service=1.0)]
        batch = choose_pool("m", BATCH, p, limits, queue_has_room=False).action
        inter = choose_pool("m", INTERACTIVE, p, limits).action
        seen.append((in_flight, batch, inter))
    first_batch_shed = min(n for n, b, _ in seen if b == Action.SHED)
    first_inter_shed = min(n for n, _, i in seen if i == Action.SHED)
    assert first_batch_shed == 3 and first_inter_shed == hard_limit(pool("e", 0.5), limits) == 8
    assert choose_pool("m", INTERACTIVE, [pool("e", 0.5, in_flight=8)]).reason == Reason.OVERLOADED


@given(st.lists(st.tuples(st.floats(0.01, 10), st.integers(0, 20), st.floats(0.01, 5), st.floats(0.001, 1)),
                min_size=1, max_size=5))
def test_the_chosen_pool_is_the_cheapest_meeting_one_when_any_meets(specs):
    pools = [pool(f"p{i}", price, in_flight=n, ttft=ttft, tpot=tpot, service=1.0)
             for i, (price, n, ttft, tpot) in enumerate(specs)]
    d = choose_pool("m", INTERACTIVE, pools)
    open_pools = [p for p in pools if p.in_flight < hard_limit(p, RouterLimits())]
    if not open_pools:
        assert d.action == Action.SHED
        return
    chosen = next(p for p in pools if p.name == d.pool)
    meeting = [p for p in open_pools if predict_ttft(p) <= 1.5 and p.tpot_s <= 0.25]
    if meeting:
        assert chosen.price_per_hour == min(p.price_per_hour for p in meeting)
        assert d.reason == Reason.CHEAPEST_MEETING_SLO
    else:
        assert predict_ttft(chosen) == min(predict_ttft(p) for p in open_pools)


def test_retry_after_follows_the_service_time():
    assert retry_after_s([pool("a", 1, service=3.2), pool("b", 1, service=7.0)], "m") == 3
    assert retry_after_s([pool("a", 1)], "m") == 1
