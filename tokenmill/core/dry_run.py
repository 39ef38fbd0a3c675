"""DryRunExecutor: an Executor with no model. It tracks each request's known tokens from the plain
SchedulerOutput (as a real executor must), "samples" a fixed token for every request whose known
tokens are all computed, and optionally advances a ManualClock by a step cost. The scheduler, KV
manager and lifecycle run for real: capacity planning (bench/prefix.py), tests, and the simulator's
executor (which replaces the cost with a performance model) build on it."""
from __future__ import annotations

from collections.abc import Callable

from tokenmill.core.clock import ManualClock
from tokenmill.core.outputs import ModelRunnerOutput
from tokenmill.core.scheduler_output import SchedulerOutput


class DryRunExecutor:
    def __init__(self, token_id: int = 0, clock: ManualClock | None = None,
                 step_cost: Callable[[SchedulerOutput], float] | None = None) -> None:
        self.token_id = token_id
        self.clock = clock
        self.step_cost = step_cost
        self.num_tokens: dict[str, int] = {}  # request id -> tokens known (prompt + sampled)

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for rid in (*out.finished_request_ids, *out.preempted_request_ids):
            self.num_tokens.pop(rid, None)
        for new in out.new_requests:
            self.num_tokens[new.request_id] = len(new.prompt_token_ids) + len(new.output_token_ids)
        computed = {c.request_id: c.num_computed_tokens for c in out.cached_requests}
        computed.update({n.request_id: n.num_computed_tokens for n in out.new_requests})
        sampled = []
        for rid, n in out.num_scheduled_tokens.items():
            # drafts (speculative tokens) follow the known ones; a dry run rejects them all
            if computed[rid] + n - len(out.spec_token_ids.get(rid, ())) == self.num_tokens[rid]:
                self.num_tokens[rid] += 1
                sampled.append(rid)
        if self.clock is not None and self.step_cost is not None:
            self.clock.advance(self.step_cost(out))
        return ModelRunnerOutput(sampled, [[self.token_id] for _ in sampled])
