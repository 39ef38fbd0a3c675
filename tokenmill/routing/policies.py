"""Router policies: which engine replica gets a request. Torch-free and engine-free: a policy sees
only the request's token ids and each replica's load (`ReplicaLoad`), so the simulator and a real
router (over live engines' metrics) run the same code.

- `RoundRobin`: replicas in turn.
- `LeastLoaded`: fewest requests in flight (running + waiting), then lowest KV usage.
- `PrefixAware`: the replica that most recently received the longest prefix of this prompt (block
  granularity, like a radix-tree router's approximate view of each replica's prefix cache), unless
  that replica is more than `max_imbalance` requests busier than the least loaded one.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class ReplicaLoad(Protocol):
    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...


@dataclass(frozen=True)
class RouteRequest:
    request_id: str
    prompt_token_ids: Sequence[int]


class RoutingPolicy(Protocol):
    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int: ...


def _load(r: ReplicaLoad) -> tuple[int, float]:
    return r.num_running + r.num_waiting, r.kv_usage


class RoundRobin:
    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        i = self._next % len(replicas)
        self._next += 1
        return i


class LeastLoaded:
    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        return min(range(len(replicas)), key=lambda i: (_load(replicas[i]), i))


class PrefixAware:
    def __init__(self, block_size: int = 16, max_imbalance: int = 8, max_entries: int = 1 << 20) -> None:
        self.block_size = block_size
        self.max_imbalance = max_imbalance
        self.max_entries = max_entries
        self._owner: OrderedDict[bytes, int] = OrderedDict()  # prefix-block hash -> replica, LRU

    def _hashes(self, tokens: Sequence[int]) -> list[bytes]:
        out, h = [], b""
        bs = self.block_size
        for i in range(len(tokens) // bs):
            h = hashlib.blake2b(h + ",".join(map(str, tokens[i * bs:(i + 1) * bs])).encode(), digest_size=16).digest()
            out.append(h)
        return out

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> int:
        hashes = self._hashes(request.prompt_token_ids)
        best, matched = None, 0
        for n, h in enumerate(hashes, 1):
            owner = self._owner.get(h)
            if owner is None or owner >= len(replicas):
                break
            best, matched = owner, n
        least = LeastLoaded().choose(request, replicas)
        if best is None or _load(replicas[best])[0] - _load(replicas[least])[0] > self.max_imbalance:
            best = least
        for h in hashes:
            self._owner[h] = best
            self._owner.move_to_end(h)
        while len(self._owner) > self.max_entries:
            self._owner.popitem(last=False)
        return best


POLICIES = {"round-robin": RoundRobin, "least-loaded": LeastLoaded, "prefix-aware": PrefixAware}


def make_policy(name: str, block_size: int = 16) -> RoutingPolicy:
    if name not in POLICIES:
        raise ValueError(f"router policy must be one of {', '.join(POLICIES)}, got {name!r}")
    return PrefixAware(block_size) if name == "prefix-aware" else POLICIES[name]()
