"""ModelTurns (one server process, several models, one awake): requests for the awake model run at
once; a request for a sleeping one waits until the awake model drains, then that model is woken;
a waiter older than the quantum stops the awake model taking new requests; a failed switch is
retried; cancelled waiters leave no trace. A hypothesis test drives random arrivals and checks the
invariants: two models never run at once, every request is served, switches happen only when drained."""
from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.server.model_turns import ModelTurns


class Device:
    """The fake engines: records switches and checks that only the awake model runs."""

    def __init__(self, fail_first: int = 0) -> None:
        self.log: list[tuple[str, str]] = []
        self.running: dict[str, int] = {}
        self.fail_first = fail_first
        self.turns: ModelTurns | None = None

    async def switch(self, asleep: str, awake: str) -> None:
        assert sum(self.running.values()) == 0, "switched while a request ran"
        await asyncio.sleep(0.001)
        if self.fail_first:
            self.fail_first -= 1
            raise RuntimeError("engine refused")
        self.log.append((asleep, awake))

    async def request(self, model: str, hold: float | asyncio.Event, served: list[str]) -> None:
        """Holds its place `hold` seconds, or until the event is set."""
        async with self.turns.turn(model):
            assert self.turns.awake == model and not self.turns.switching
            assert all(n == 0 for m, n in self.running.items() if m != model), "two models ran at once"
            self.running[model] = self.running.get(model, 0) + 1
            await (hold.wait() if isinstance(hold, asyncio.Event) else asyncio.sleep(hold))
            self.running[model] -= 1
            served.append(model)


def _turns(device: Device, quantum_s: float = 10.0) -> ModelTurns:
    device.turns = ModelTurns(["a", "b"], device.switch, quantum_s)
    return device.turns


def test_awake_model_runs_at_once_sleeping_one_waits_for_the_drain():
    async def main():
        d = Device()
        turns = _turns(d)
        served: list[str] = []
        release_a = asyncio.Event()
        first = asyncio.create_task(d.request("a", release_a, served))
        while d.running.get("a") != 1:
            await asyncio.sleep(0)
        second = asyncio.create_task(d.request("b", 0.0, served))
        for _ in range(20):  # whatever the scheduling, "b" waits while "a" runs
            await asyncio.sleep(0)
        assert turns.num_waiting("b") == 1 and d.log == [] and turns.in_flight["a"] == 1
        release_a.set()
        await asyncio.gather(first, second)
        assert served == ["a", "b"] and d.log == [("a", "b")] and turns.awake == "b" and turns.switches == 1
    asyncio.run(main())


def test_quantum_stops_a_steady_stream_from_holding_the_device():
    async def main():
        d = Device()
        turns = _turns(d, quantum_s=0.05)
        served: list[str] = []
        stop = asyncio.Event()

        async def steady():  # back-to-back requests for "a", overlapping
            tasks = []
            while not stop.is_set():
                tasks.append(asyncio.create_task(d.request("a", 0.02, served)))
                await asyncio.sleep(0.005)
            await asyncio.gather(*tasks)

        stream = asyncio.create_task(steady())
        await asyncio.sleep(0.02)
        await asyncio.wait_for(d.request("b", 0.0, served), timeout=30.0)  # got its turn despite the stream
        stop.set()
        await stream
        assert ("a", "b") in d.log and turns.switches >= 1
    asyncio.run(main())


def test_failed_switch_is_retried_and_cancelled_waiter_leaves_no_trace():
    async def main():
        d = Device(fail_first=1)
        turns = _turns(d)
        served: list[str] = []
        gone = asyncio.create_task(d.request("b", 0.0, served))
        await asyncio.sleep(0)
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert turns.num_waiting("b") == 0
        await asyncio.wait_for(d.request("b", 0.0, served), timeout=30.0)
        assert served == ["b"] and turns.awake == "b" and d.log == [("a", "b")]
        assert all(n == 0 for n in turns.in_flight.values())
    asyncio.run(main())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 3), st.integers(0, 3)),
                min_size=1, max_size=20),
       st.sampled_from([0.0, 0.005, 1.0]))
def test_random_arrivals_all_served_one_model_at_a_time(arrivals, quantum_s):
    async def main():
        d = Device()
        d.turns = ModelTurns(["a", "b", "c"], d.switch, quantum_s)
        served: list[str] = []
        tasks = []
        for model, gap, hold in arrivals:
            await asyncio.sleep(gap / 1000)
            tasks.append(asyncio.create_task(d.request(model, hold / 1000, served)))
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        assert sorted(served) == sorted(m for m, _, _ in arrivals)
        assert all(n == 0 for n in d.turns.in_flight.values())
        assert all(not w for w in d.turns.waiters.values())
        for (asleep, awake), nxt in zip(d.log, d.log[1:]):  # each switch starts where the last ended
            assert nxt[0] == awake
    asyncio.run(main())
