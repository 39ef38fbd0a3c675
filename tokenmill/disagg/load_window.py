"""What the router saw over one planner interval, for the profile-driven planner (`IntervalLoad`):
requests and their prompt tokens (as routed), TTFT of the streams it relayed, and, from the
engines' scraped counters, tokens generated and the mean ITL (deltas since the last interval)."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenmill.disagg.policy import InstanceState
from tokenmill.disagg.sla_planner import IntervalLoad


@dataclass
class LoadWindow:
    started: float = field(default_factory=time.monotonic)
    num_requests: int = 0
    num_remote: int = 0
    remote_tokens: int = 0
    local_tokens: int = 0
    ttft: list[tuple[int, float]] = field(default_factory=list)  # (prompt tokens, seconds)
    _counters: dict[str, tuple[float, float, float]] = field(default_factory=dict)  # url -> at the last close

    def record_request(self, prompt_tokens: int, remote: bool) -> None:
        """One request; `remote`: long enough to hand over (whether or not a prefill engine took it)."""
        self.num_requests += 1
        if remote:
            self.num_remote += 1
            self.remote_tokens += prompt_tokens
        else:
            self.local_tokens += prompt_tokens

    def record_ttft(self, prompt_tokens: int, seconds: float) -> None:
        self.ttft.append((prompt_tokens, seconds))

    def close(self, instances: Sequence[InstanceState], decodes: Sequence[InstanceState],
              now: float | None = None) -> IntervalLoad:
        """The interval's `IntervalLoad`; starts the next interval."""
        now = time.monotonic() if now is None else now
        gen = itl_sum = itl_n = 0.0
        for inst in instances:
            g0, s0, n0 = self._counters.get(inst.url, (inst.generation_tokens, inst.itl_sum_s, inst.itl_count))
            if inst.generation_tokens >= g0 and inst.itl_count >= n0:  # else the engine restarted: skip it once
                gen += inst.generation_tokens - g0
                itl_sum += inst.itl_sum_s - s0
                itl_n += inst.itl_count - n0
            self._counters[inst.url] = (inst.generation_tokens, inst.itl_sum_s, inst.itl_count)
        live = [d for d in decodes if d.healthy]
        load = IntervalLoad(
            interval_s=max(now - self.started, 1e-3), num_requests=self.num_requests, num_remote_requests=self.num_remote,
            remote_prompt_tokens=self.remote_tokens, local_prompt_tokens=self.local_tokens, output_tokens=gen,
            ttft_samples=tuple(self.ttft),
            itl_s=itl_sum / itl_n if itl_n else None,
            decode_batch=max(1.0, sum(d.num_running for d in live) / len(live)) if live else 1.0)
        self.started = now
        self.num_requests = self.num_remote = self.remote_tokens = self.local_tokens = 0
        self.ttft = []
        return load
