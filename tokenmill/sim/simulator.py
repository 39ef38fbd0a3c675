"""The cluster simulator: many real `EngineCore`s (scheduler, KV manager, prefix cache, preemption,
chunked prefill all unchanged), each on its own ManualClock with a `PerfModelExecutor`, a router
policy in front, and optionally prefill/decode roles with a KV-transfer time model.

Discrete events: a request arrival (to the router) or a KV hand-off (prefill -> decode pool) at a
time, and engine steps. The next thing to happen is the earliest of the next event and the start of
the next step of the busy replica whose clock is earliest; a request that arrives while its replica
is mid-step waits for the step to end, as in the real engine loop. An idle replica's clock jumps to
the arrival.

Disaggregation: a prefill replica runs the prompt and samples the first token (max_tokens=1); its
KV then travels for `KVTransfer.time(bytes)` and the decode replica adopts it: the request enters
the decode replica's real scheduler with its prompt plus first token, and the executor charges no
compute for the transferred tokens (it still takes their KV blocks and token budget for the step
that adopts them).
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenmill.core.clock import ManualClock
from tokenmill.core.engine_core import EngineCore
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.request import Request
from tokenmill.routing.policies import RouteRequest, RoutingPolicy, make_policy
from tokenmill.sampling_params import SamplingParams
from tokenmill.sim.executor import PerfModelExecutor
from tokenmill.sim.perf_model import PerfModel

ROLES = ("unified", "prefill", "decode")


@dataclass(frozen=True)
class SimRequest:
    request_id: str
    arrival: float
    prompt_token_ids: list[int]
    output_len: int
    group: int | None = None


@dataclass
class SimResult:
    request_id: str
    arrival: float
    prompt_len: int
    output_len: int
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    queue_time: float = 0.0  # arrival to first scheduled (on the first replica)
    replicas: list[int] = field(default_factory=list)

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def e2e(self) -> float:
        return self.token_times[-1] - self.arrival


@dataclass(frozen=True)
class KVTransfer:
    bytes_per_s: float
    latency_s: float = 0.0

    def time(self, num_bytes: float) -> float:
        return self.latency_s + num_bytes / self.bytes_per_s


@dataclass(frozen=True)
class ReplicaSpec:
    perf: PerfModel
    scheduler: SchedulerConfig
    num_kv_blocks: int
    block_size: int = 16
    enable_prefix_caching: bool = True
    role: str = "unified"
    price_per_hour: float = 0.0  # of all its devices
    continuous_batching: bool = True

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks} (the weights leave no "
                             "room for KV cache?)")


class Replica:
    def __init__(self, index: int, spec: ReplicaSpec, record_steps: bool = False) -> None:
        self.index = index
        self.spec = spec
        self.clock = ManualClock()
        self.executor = PerfModelExecutor(spec.perf, self.clock, record=record_steps)
        kv = KVCacheManager(spec.num_kv_blocks, spec.block_size, spec.enable_prefix_caching)
        self.core = EngineCore(spec.scheduler, kv, self.executor, self.clock)
        self.held: list[Request] = []  # arrivals waiting for the batch to drain (no continuous batching)
        self.batch_open = True

    @property
    def role(self) -> str:
        return self.spec.role

    # ReplicaLoad, for the router
    @property
    def num_running(self) -> int:
        return len(self.core.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.core.scheduler.waiting)

    @property
    def kv_usage(self) -> float:
        return self.core.kv.usage()

    @property
    def busy(self) -> bool:
        return self.core.has_unfinished_requests()

    def admit(self, request: Request) -> None:
        """Continuous batching: straight to the scheduler. Without it (request-level batching, the
        baseline continuous batching replaced), a request waits until the whole running batch has
        finished, then up to max_num_seqs enter together."""
        room = self.batch_open and self.num_running + self.num_waiting < self.spec.scheduler.max_num_seqs
        if self.spec.continuous_batching or room:
            self.core.add_request(request)
        else:
            self.held.append(request)

    def start_step(self) -> None:
        self.batch_open = False

    def release_held(self) -> None:
        """After a step: an idle replica without continuous batching opens the next batch."""
        if self.busy:
            return
        self.batch_open = True
        batch, self.held = self.held[:self.spec.scheduler.max_num_seqs], self.held[self.spec.scheduler.max_num_seqs:]
        for request in batch:
            self.core.add_request(request)


class ClusterSimulator:
    def __init__(self, replicas: Sequence[ReplicaSpec], router: RoutingPolicy | str = "least-loaded",
                 decode_router: RoutingPolicy | str = "least-loaded", transfer: KVTransfer | None = None,
                 record_steps: bool = False) -> None:
        self.replicas = [Replica(i, s, record_steps) for i, s in enumerate(replicas)]
        roles = {r.role for r in self.replicas}
        if "unified" in roles and len(roles) > 1:
            raise ValueError("replicas are either all unified or prefill + decode, not a mix")
        if roles in ({"prefill"}, {"decode"}):
            raise ValueError("disaggregation needs at least one prefill and one decode replica")
        self.disaggregated = "prefill" in roles
        if self.disaggregated and transfer is None:
            raise ValueError("prefill/decode replicas need a KV transfer model (link bandwidth)")
        bs = self.replicas[0].spec.block_size
        self.router = make_policy(router, bs) if isinstance(router, str) else router
        self.decode_router = make_policy(decode_router, bs) if isinstance(decode_router, str) else decode_router
        self.transfer = transfer
        self.front = [r for r in self.replicas if r.role in ("unified", "prefill")]
        self.back = [r for r in self.replicas if r.role == "decode"]
        self._events: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self.results: dict[str, SimResult] = {}
        self._pending: dict[str, SimRequest] = {}  # request id -> request, while on a replica
        self.end_time = 0.0

    def _push(self, t: float, kind: str, payload: object) -> None:
        heapq.heappush(self._events, (t, next(self._seq), kind, payload))

    def run(self, requests: Sequence[SimRequest]) -> list[SimResult]:
        for r in requests:
            if r.output_len < 1 or not r.prompt_token_ids:
                raise ValueError(f"request {r.request_id!r}: needs a prompt and output_len >= 1")
            self.results[r.request_id] = SimResult(r.request_id, r.arrival, len(r.prompt_token_ids), r.output_len)
            self._push(r.arrival + self._admission_s(r), "arrive", r)
        while True:
            busy = [r for r in self.replicas if r.busy]
            nxt = min(busy, key=lambda r: (r.clock.now, r.index)) if busy else None
            t_event = self._events[0][0] if self._events else math.inf
            if nxt is None and math.isinf(t_event):
                break
            if nxt is None or t_event <= nxt.clock.now:
                t, _, kind, payload = heapq.heappop(self._events)
                self._deliver(t, kind, payload)
            else:
                self._step(nxt)
        return [self.results[r.request_id] for r in requests]

    def _admission_s(self, r: SimRequest) -> float:
        """A measured server's HTTP + tokenization time before the request reaches a scheduler."""
        serving = getattr(self.front[0].spec.perf, "serving", None)  # a bare step_time() model has none
        return serving.admission_s(len(r.prompt_token_ids)) if serving is not None else 0.0

    def _deliver(self, t: float, kind: str, payload: object) -> None:
        if kind == "arrive":
            req: SimRequest = payload  # type: ignore[assignment]
            pool, router = self.front, self.router
            max_tokens = 1 if self.disaggregated else req.output_len
            tokens, remote = req.prompt_token_ids, 0
        else:  # "handoff": the prefill's KV landed; decode the rest
            req, first_token = payload  # type: ignore[misc]
            pool, router = self.back, self.decode_router
            max_tokens = req.output_len - 1
            tokens, remote = [*req.prompt_token_ids, first_token], len(req.prompt_token_ids)
        i = router.choose(RouteRequest(req.request_id, tokens), pool)
        replica = pool[i]
        if not replica.busy:
            replica.clock.now = max(replica.clock.now, t)
        if remote:
            replica.executor.remote_kv[req.request_id] = remote
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        replica.admit(Request(req.request_id, tokens, params, None, req.arrival, max_tokens))
        self.results[req.request_id].replicas.append(replica.index)
        self._pending[req.request_id] = req

    def _step(self, replica: Replica) -> None:
        before = replica.clock.now
        replica.start_step()
        out = replica.core.step()
        if out.iteration.num_seqs == 0 and replica.clock.now == before:
            stuck = [r.request_id for r in replica.core.scheduler.waiting]
            raise ValueError(f"replica {replica.index} cannot schedule {stuck[:3]}: a request needs more KV "
                             f"blocks than the replica has ({replica.spec.num_kv_blocks} of "
                             f"{replica.spec.block_size} tokens)")
        for o in out.outputs:
            res = self.results[o.request_id]
            self._on_tokens(res, len(o.new_token_ids), replica.clock.now)
            res.token_times.extend([replica.clock.now] * len(o.new_token_ids))
        for req in out.finished_requests:
            res = self.results[req.request_id]
            res.num_preemptions += req.events.num_preemptions
            if self._started_here(replica, req.request_id):
                res.num_cached_tokens = req.num_cached_tokens
                res.queue_time = (req.events.first_scheduled or req.events.arrival) - req.events.arrival
            sim_req = self._pending.pop(req.request_id)
            if self._hands_off(replica, sim_req):
                nbytes = len(sim_req.prompt_token_ids) * replica.spec.perf.kv_bytes_per_token
                self._push(replica.clock.now + self.transfer.time(nbytes), "handoff",
                           (sim_req, req.output_token_ids[0]))
        replica.release_held()
        self.end_time = max(self.end_time, replica.clock.now)

    # hooks (the elastic simulator, sim/elastic.py, decides these per request)
    def _on_tokens(self, res: SimResult, n: int, now: float) -> None:
        """`n` tokens of a request stamped at `now` (before they join `res.token_times`)."""

    def _started_here(self, replica: Replica, request_id: str) -> bool:
        """Whether the request began on this replica (its prefix-cache hit and queue time count)."""
        return replica.role != "decode"

    def _hands_off(self, replica: Replica, req: SimRequest) -> bool:
        """Whether a request finishing on this replica moves on to the decode pool."""
        return replica.role == "prefill" and req.output_len > 1

    # -- totals ---------------------------------------------------------------------------------
    @property
    def price_per_hour(self) -> float:
        return sum(r.spec.price_per_hour for r in self.replicas)

    def utilisation(self) -> list[float]:
        """Busy share of each replica over the run."""
        span = self.end_time or 1.0
        return [r.executor.busy_time / span for r in self.replicas]
