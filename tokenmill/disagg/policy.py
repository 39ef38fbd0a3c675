"""The disaggregating router's policy, as pure functions over plain instance states (torch-free,
engine-free: unit-tested on fake states; a fleet router or the simulator can call them too).

Per request (llm-d's order, Dynamo's conditional disaggregation):
1. `pick_decode`: the decode instance first (role decode or both), by a score of prefix-cache
   overlap (from the engine's KV block events: the leading blocks of the prompt it holds) against
   load (requests queued and running, KV usage).
2. `plan_route`: disaggregate only when the part of the prompt the chosen instance does not hold is
   long (>= `min_remote_prefill_tokens`), the chosen instance can receive (role decode), and some
   healthy prefill instance has a queue below `max_prefill_queue` (else the prefill pool is the
   bottleneck and the decode instance prefills itself). The prefill instance is picked the same
   way (overlap, then load).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tokenmill.core.kv_cache_manager import hash_block


@dataclass
class InstanceState:
    """What the router knows of one engine (scraped from /metrics and /v1/kv/events, plus the
    requests the router itself has in flight there)."""
    url: str
    role: str  # prefill | decode | both
    healthy: bool = True
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    in_flight: int = 0  # requests this router sent and that have not finished
    cached: set[bytes] = field(default_factory=set)  # block hashes in its prefix cache
    # counters from /metrics, for the planner's per-interval deltas
    generation_tokens: float = 0.0
    itl_sum_s: float = 0.0
    itl_count: float = 0.0

    @property
    def queue(self) -> int:
        """Requests it is working on: the fresher of the scrape and the router's own count."""
        return max(self.num_running + self.num_waiting, self.in_flight)


@dataclass(frozen=True)
class RouterConfig:
    min_remote_prefill_tokens: int = 256  # shorter uncached suffixes are prefilled by the decode instance
    max_prefill_queue: int = 8  # a prefill instance with this many queued is the bottleneck
    overlap_weight: float = 1.0  # score per fraction of the prompt already cached
    load_weight: float = 0.1  # score cost per queued request
    kv_weight: float = 0.5  # score cost per fraction of KV in use

    def __post_init__(self) -> None:
        for name in ("min_remote_prefill_tokens", "max_prefill_queue"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class RouteDecision:
    decode: int  # index into the decode candidates
    prefill: int | None  # index into the prefill instances, None: the decode instance prefills
    overlap_tokens: int  # prompt tokens the decode instance holds
    reason: str


def prompt_block_hashes(token_ids: Sequence[int], block_size: int, hash_key: str) -> list[bytes]:
    """The engine's own chained block hashes (core/kv_cache_manager.py) of the prompt's full blocks."""
    out: list[bytes] = []
    for i in range(len(token_ids) // block_size):
        out.append(hash_block(out[-1] if out else None, list(token_ids[i * block_size:(i + 1) * block_size]),
                              hash_key))
    return out


def overlap_blocks(hashes: Sequence[bytes], cached: set[bytes]) -> int:
    """Leading blocks of the prompt the instance holds (a chain: the first miss ends it)."""
    n = 0
    for h in hashes:
        if h not in cached:
            break
        n += 1
    return n


def decode_score(inst: InstanceState, overlap: int, num_blocks: int, cfg: RouterConfig) -> float:
    frac = overlap / num_blocks if num_blocks else 0.0
    return cfg.overlap_weight * frac - cfg.load_weight * inst.queue - cfg.kv_weight * inst.kv_usage


def _best(candidates: Iterable[tuple[int, float]]) -> int | None:
    best, best_score = None, float("-inf")
    for i, score in candidates:
        if score > best_score:
            best, best_score = i, score
    return best


def pick_decode(hashes: Sequence[bytes], decodes: Sequence[InstanceState], cfg: RouterConfig,
                exclude: set[int] = frozenset()) -> tuple[int, int] | None:
    """(index, overlap in blocks) of the best healthy decode candidate, or None."""
    n = len(hashes)
    overlaps = {i: overlap_blocks(hashes, d.cached) for i, d in enumerate(decodes) if d.healthy and i not in exclude}
    i = _best((i, decode_score(decodes[i], ov, n, cfg)) for i, ov in overlaps.items())
    return None if i is None else (i, overlaps[i])


def pick_prefill(hashes: Sequence[bytes], prefills: Sequence[InstanceState], cfg: RouterConfig) -> int | None:
    """The best healthy prefill instance whose queue is below the bottleneck mark, or None."""
    n = len(hashes)
    return _best((i, decode_score(p, overlap_blocks(hashes, p.cached), n, cfg)) for i, p in enumerate(prefills)
                 if p.healthy and p.queue < cfg.max_prefill_queue)


def plan_route(num_prompt_tokens: int, hashes: Sequence[bytes], block_size: int, decodes: Sequence[InstanceState],
               prefills: Sequence[InstanceState], cfg: RouterConfig,
               exclude: set[int] = frozenset()) -> RouteDecision | None:
    """Where one request goes; None when no decode candidate is healthy."""
    picked = pick_decode(hashes, decodes, cfg, exclude)
    if picked is None:
        return None
    d, overlap = picked
    overlap_tokens = overlap * block_size
    uncached = num_prompt_tokens - overlap_tokens
    if decodes[d].role != "decode":
        return RouteDecision(d, None, overlap_tokens, "colocated instance")
    if uncached < cfg.min_remote_prefill_tokens:
        return RouteDecision(d, None, overlap_tokens, f"uncached suffix {uncached} < {cfg.min_remote_prefill_tokens}")
    p = pick_prefill(hashes, prefills, cfg)
    if p is None:
        return RouteDecision(d, None, overlap_tokens, "no prefill instance below the queue limit")
    return RouteDecision(d, p, overlap_tokens, f"uncached suffix {uncached} >= {cfg.min_remote_prefill_tokens}")
