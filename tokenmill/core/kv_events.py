"""KV block events: which block hashes an engine's prefix cache stored and evicted, in order, for a
router that scores instances by prefix overlap (llm-d's and Dynamo's KV events, polled).

The block pool reports on the engine thread; readers (an HTTP handler) call `since(seq)` from any
thread. The log keeps the last `max_events` events; a reader that fell further behind (or starts at
0) gets a snapshot of every cached hash instead, flagged `reset`.
"""
from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field


@dataclass
class KVEventBatch:
    seq: int  # pass it back as `since` next time
    reset: bool  # True: `stored` is the whole cache; forget what you knew
    stored: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)


class KVEventLog:
    def __init__(self, max_events: int = 1 << 16) -> None:
        self._lock = threading.Lock()
        self._events: deque[tuple[int, bool, bytes]] = deque(maxlen=max_events)  # (seq, stored?, hash)
        self._live: set[bytes] = set()
        self._seq = 0
        self._epoch_start = 0  # events before a cache reset are meaningless

    def stored(self, block_hash: bytes) -> None:
        with self._lock:
            self._seq += 1
            self._events.append((self._seq, True, block_hash))
            self._live.add(block_hash)

    def removed(self, block_hash: bytes) -> None:
        with self._lock:
            self._seq += 1
            self._events.append((self._seq, False, block_hash))
            self._live.discard(block_hash)

    def cleared(self) -> None:
        with self._lock:
            self._seq += 1
            self._events.clear()
            self._live.clear()
            self._epoch_start = self._seq

    def since(self, seq: int) -> KVEventBatch:
        with self._lock:
            oldest = self._events[0][0] if self._events else self._seq + 1
            if seq < self._epoch_start or seq + 1 < oldest or seq > self._seq or seq == 0:
                return KVEventBatch(self._seq, True, list(self._live))
            out = KVEventBatch(self._seq, False)
            for _, is_store, h in itertools.islice(self._events, seq + 1 - oldest, None):  # seqs are consecutive
                (out.stored if is_store else out.removed).append(h)
            return out
