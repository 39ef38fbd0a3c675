"""Turns between the models one server process holds: one model awake (its KV cache allocated),
the others asleep (weights in host memory, KV cache released); a request for a sleeping model waits
for that model's turn.

The policy (the same as the fleet's switch groups, fleet/switching.py, inside one process):
- a request for the awake model runs at once, unless another model has a request that has waited
  `quantum_s` (counted from the start of the awake model's turn at the earliest): then the awake
  model takes no new requests and drains, so a steady stream cannot hold the device forever;
- once the awake model has nothing in flight and another model has waiters, the model whose
  waiter is the oldest gets the turn: the awake one is put to sleep, that one woken, and all its
  waiters run;
- requests for one model are granted in arrival order.

Switching is per request, not per token: a turn ends only when its requests do. `switch(asleep,
awake)` is the caller's (it sleeps one engine and wakes the other); a failed switch is retried.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)
RETRY_S = 0.1

Switch = Callable[[str, str], Awaitable[None]]  # (model to sleep, model to wake)


@dataclass
class _Waiter:
    since: float
    future: asyncio.Future


class ModelTurns:
    def __init__(self, models: list[str], switch: Switch, quantum_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not models:
            raise ValueError("models: at least one")
        self.models = list(models)
        self.awake = models[0]
        self.quantum_s = quantum_s
        self.clock = clock
        self._switch = switch
        self.in_flight = dict.fromkeys(models, 0)
        self.waiters: dict[str, deque[_Waiter]] = {m: deque() for m in models}
        self.switching = False
        self.awake_since = clock()
        self.switches = 0
        self.switch_seconds = 0.0
        self._task: asyncio.Task | None = None

    # -- the policy ---------------------------------------------------------------------------------
    def admits(self, model: str) -> bool:
        """May a new request for `model` run now?"""
        if self.switching or model != self.awake or self.waiters[model]:
            return False
        now = self.clock()
        return not any(w and now - max(w[0].since, self.awake_since) >= self.quantum_s
                       for name, w in self.waiters.items() if name != model)

    def next_model(self) -> str | None:
        """The sleeping model whose waiter arrived first, if any waits."""
        waiting = [(w[0].since, name) for name, w in self.waiters.items() if w and name != self.awake]
        return min(waiting)[1] if waiting else None

    def num_waiting(self, model: str) -> int:
        return len(self.waiters[model])

    # -- requests -------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def turn(self, model: str) -> AsyncIterator[None]:
        """Hold a place on `model` (waiting for its turn) while the body runs."""
        await self._acquire(model)
        try:
            yield
        finally:
            self.in_flight[model] -= 1
            self._progress()

    async def _acquire(self, model: str) -> None:
        if self.admits(model):
            self.in_flight[model] += 1
            return
        waiter = _Waiter(self.clock(), asyncio.get_running_loop().create_future())
        self.waiters[model].append(waiter)
        self._progress()
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():  # granted meanwhile: give it back
                self.in_flight[model] -= 1
            else:
                self.waiters[model].remove(waiter)
            self._progress()
            raise

    def _grant(self, model: str, all_of_them: bool) -> None:
        q = self.waiters[model]
        while q and (all_of_them or not self._quantum_expired(model)):
            w = q.popleft()
            if not w.future.done():
                self.in_flight[model] += 1
                w.future.set_result(None)

    def _quantum_expired(self, model: str) -> bool:
        now = self.clock()
        return any(w and now - max(w[0].since, self.awake_since) >= self.quantum_s
                   for name, w in self.waiters.items() if name != model)

    def _progress(self) -> None:
        """Run what may run now; start a switch when the awake model has drained and others wait."""
        if self.switching:
            return
        self._grant(self.awake, all_of_them=False)
        target = self.next_model()
        # (while the awake model still runs requests, the end of each one brings us back here)
        if target is not None and self.in_flight[self.awake] == 0:
            self.switching = True
            self._task = asyncio.get_running_loop().create_task(self._do_switch(target))

    async def _do_switch(self, target: str) -> None:
        start = self.clock()
        try:
            await self._switch(self.awake, target)
        except Exception:
            logger.exception("switching from %s to %s failed; retrying", self.awake, target)
            await asyncio.sleep(RETRY_S)
            self.switching, self._task = False, None
            self._progress()
            return
        logger.info("model turns: %s asleep, %s awake (%.3f s)", self.awake, target, self.clock() - start)
        self.awake, self.awake_since = target, self.clock()
        self.switches += 1
        self.switch_seconds += self.clock() - start
        self.switching, self._task = False, None
        self._grant(target, all_of_them=True)
        self._progress()
