"""What the engine's last requests used, kept after they end: a fleet in front bills a request its
client abandoned (the stream closed, the request aborted) by asking for it afterwards.

`RecentMap` is a bounded, insertion-ordered map (the oldest entries go first): the engine's maps
each frontend request id to its `EndedUsage` (tokens and the device-seconds the engine charged it);
the server's maps each HTTP request's X-Request-Id to its engine request ids.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

from tokenmill.request import RequestEvents

DEFAULT_CAPACITY = 4096
K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class EndedUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    prefill_device_seconds: float
    decode_device_seconds: float
    aborted: bool

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int,
           events: list[RequestEvents | None], aborted: bool) -> EndedUsage:
        evs = [e for e in events if e is not None]
        return cls(prompt_tokens, completion_tokens, cached_tokens, sum(e.prefill_device_seconds for e in evs),
                   sum(e.decode_device_seconds for e in evs), aborted)


class RecentMap(Generic[K, V]):
    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()

    def record(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def __len__(self) -> int:
        return len(self._entries)
