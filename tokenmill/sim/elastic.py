"""Elastic P:D in the simulator: the profile-driven planner of `tokenmill cluster`
(`disagg/sla_planner.ProfilePlanner`, unchanged) moving simulated replicas between the prefill and
decode pools every `interval_s` of simulated time.

Routing follows `tokenmill cluster`'s router: a prompt of at least `min_remote_prefill_tokens`
goes to the prefill pool (when it has a replica; max_tokens 1, then a KV hand-off to the decode
pool), any other to the decode pool, which serves it whole (prefill and decode: colocated). Whether
a request hands off is decided when it is routed, so a replica moved out of the prefill pool still
hands off what it was prefilling. Each interval the planner gets the `IntervalLoad` the router
would have seen: arrivals and their prompt tokens, tokens generated, each first token's TTFT with
its prompt length, the mean gap between consecutive tokens (ITL) and the mean decode batch.
Every move is kept in `moves` (time, replica, new role, reason).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tokenmill.disagg.sla_planner import IntervalLoad, ProfilePlanner
from tokenmill.request import Request
from tokenmill.routing.policies import RouteRequest, RoutingPolicy
from tokenmill.sampling_params import SamplingParams
from tokenmill.sim.simulator import ClusterSimulator, KVTransfer, Replica, ReplicaSpec, SimRequest, SimResult


class _Window:
    def __init__(self) -> None:
        self.requests = self.remote = self.remote_tokens = self.local_tokens = 0
        self.output_tokens = 0
        self.ttft: list[tuple[int, float]] = []
        self.itl_sum = 0.0
        self.itl_count = 0


class ElasticClusterSimulator(ClusterSimulator):
    def __init__(self, replicas: Sequence[ReplicaSpec], planner: ProfilePlanner, transfer: KVTransfer,
                 min_remote_prefill_tokens: int = 256, router: RoutingPolicy | str = "least-loaded",
                 decode_router: RoutingPolicy | str = "least-loaded", record_steps: bool = False) -> None:
        super().__init__(replicas, router, decode_router, transfer, record_steps)
        self.planner = planner
        self.min_remote = min_remote_prefill_tokens
        self.moves: list[tuple[float, int, str, str]] = []
        self.pool_sizes: list[tuple[float, int, int]] = []  # (time, prefill, decode) after each decision
        self._prefill_only: set[str] = set()
        self._adopted: set[str] = set()
        self._window = _Window()
        self._window_start = 0.0

    def run(self, requests: Sequence[SimRequest]) -> list[SimResult]:
        self._push(self.planner.cfg.interval_s, "plan", None)
        return super().run(requests)

    def _admission_s(self, r: SimRequest) -> float:
        serving = getattr(self.replicas[0].spec.perf, "serving", None)
        return serving.admission_s(len(r.prompt_token_ids)) if serving is not None else 0.0

    # -- routing and hand-offs ------------------------------------------------------------------
    def _deliver(self, t: float, kind: str, payload: object) -> None:
        if kind == "plan":
            self._plan(t)
        elif kind == "handoff":
            self._adopted.add(payload[0].request_id)  # type: ignore[index]
            super()._deliver(t, kind, payload)
        else:
            self._arrive(t, payload)  # type: ignore[arg-type]

    def _arrive(self, t: float, req: SimRequest) -> None:
        n = len(req.prompt_token_ids)
        remote = n >= self.min_remote
        w = self._window
        w.requests += 1
        w.remote += remote
        w.remote_tokens += n if remote else 0
        w.local_tokens += 0 if remote else n
        to_prefill = remote and bool(self.front) and req.output_len > 1
        pool, router = (self.front, self.router) if to_prefill else (self.back, self.decode_router)
        replica = pool[router.choose(RouteRequest(req.request_id, req.prompt_token_ids), pool)]
        if not replica.busy:
            replica.clock.now = max(replica.clock.now, t)
        max_tokens = 1 if to_prefill else req.output_len
        if to_prefill:
            self._prefill_only.add(req.request_id)
        replica.admit(Request(req.request_id, req.prompt_token_ids, SamplingParams(max_tokens=max_tokens,
                                                                                    ignore_eos=True),
                              None, req.arrival, max_tokens))
        self.results[req.request_id].replicas.append(replica.index)
        self._pending[req.request_id] = req

    def _hands_off(self, replica: Replica, req: SimRequest) -> bool:
        if req.request_id in self._prefill_only:
            self._prefill_only.discard(req.request_id)
            return True
        return False

    def _started_here(self, replica: Replica, request_id: str) -> bool:
        return request_id not in self._adopted

    def _on_tokens(self, res: SimResult, n: int, now: float) -> None:
        w = self._window
        w.output_tokens += n
        if not res.token_times:
            w.ttft.append((res.prompt_len, now - res.arrival))
        else:
            w.itl_sum += now - res.token_times[-1]
            w.itl_count += 1

    # -- the planner ----------------------------------------------------------------------------
    def _plan(self, t: float) -> None:
        w = self._window
        running = [r.num_running for r in self.back]
        load = IntervalLoad(t - self._window_start, w.requests, w.remote, w.remote_tokens, w.local_tokens,
                            float(w.output_tokens), tuple(w.ttft), w.itl_sum / w.itl_count if w.itl_count else None,
                            max(1.0, sum(running) / len(running)) if running else 1.0)
        self._window, self._window_start = _Window(), t
        d = self.planner.step(self.front, self.back, load)
        if d.move:
            src, dst, role = (self.back, self.front, "prefill") if d.move > 0 else (self.front, self.back, "decode")
            i = min(range(len(src)), key=lambda k: (src[k].num_running + src[k].num_waiting, k))
            replica = src.pop(i)
            replica.spec = dataclasses.replace(replica.spec, role=role)
            dst.append(replica)
            self.moves.append((t, replica.index, role, d.reason))
        self.pool_sizes.append((t, len(self.front), len(self.back)))
        if self._events or any(r.busy for r in self.replicas):
            self._push(t + self.planner.cfg.interval_s, "plan", None)
