"""AsyncLLMEngine's hand-over to its loop thread, over a fake engine (no model)."""
from __future__ import annotations

import asyncio

import pytest

from tokenmill.engine.async_engine import AsyncLLMEngine
from tokenmill.engine.errors import EngineDeadError, EngineShutdownError
from tokenmill.sampling_params import SamplingParams

SAFETY_NET_S = 30.0  # only against a hang; a correct engine answers at once


class FakeEngine:
    """The LLMEngine surface the loop uses; `step` fails when `fail` is set."""

    def __init__(self) -> None:
        self.requests: dict[str, object] = {}
        self.fail = False

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list:
        if self.fail:
            raise RuntimeError("simulated device failure")
        return []

    def add_request(self, request_id, prompt, params, arrival_time=None) -> str:
        self.requests[request_id] = prompt
        return request_id

    def abort_request(self, request_id) -> None:
        self.requests.pop(request_id, None)

    def num_waiting_requests(self) -> int:
        return len(self.requests)

    def log_stats(self, finished=None) -> None:
        pass


def _stop_right_after_the_check(monkeypatch, engine: AsyncLLMEngine, stop) -> None:
    """The race: `_check_accepting` passes, then the loop stops before the add is submitted."""
    real_check = engine._check_accepting

    def check_then_stop() -> None:
        real_check()
        stop()
        assert not engine.is_running

    monkeypatch.setattr(engine, "_check_accepting", check_then_stop)


def test_add_racing_shutdown_fails_at_once(monkeypatch):
    engine = AsyncLLMEngine(FakeEngine())
    _stop_right_after_the_check(monkeypatch, engine, engine.shutdown)

    async def main() -> None:
        with pytest.raises(EngineShutdownError):
            await asyncio.wait_for(engine.add_request("a", [1, 2], SamplingParams()), SAFETY_NET_S)

    asyncio.run(main())
    assert engine.num_waiting() == 0


def test_add_racing_engine_death_fails_at_once(monkeypatch):
    fake = FakeEngine()
    engine = AsyncLLMEngine(fake)

    async def main() -> None:
        stream = await engine.add_request("a", [1, 2], SamplingParams())

        def die() -> None:  # the next step raises and the loop thread ends
            fake.fail = True
            engine._thread.join(SAFETY_NET_S)

        _stop_right_after_the_check(monkeypatch, engine, die)
        with pytest.raises(EngineDeadError):
            await asyncio.wait_for(engine.add_request("b", [3], SamplingParams()), SAFETY_NET_S)
        with pytest.raises(EngineDeadError):  # the request that was running got the error too
            await asyncio.wait_for(stream.next_outputs(), SAFETY_NET_S)

    asyncio.run(main())
    assert engine.dead_error is not None and not engine.is_healthy
