"""A clock the caller advances: tests and the simulator drive EngineCore with it instead of
time.monotonic."""
from __future__ import annotations


class ManualClock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        self.now += seconds
