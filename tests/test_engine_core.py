"""EngineCore without a model: torch-free, driven by an injected clock, plain data across the
executor boundary, and the request lifecycle (stops, finish, free, preemption) in one place."""
import pickle
import subprocess
import sys

from tokenmill.core.clock import ManualClock
from tokenmill.core.dry_run import DryRunExecutor
from tokenmill.core.engine_core import EngineCore
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.outputs import ModelRunnerOutput
from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.request import FinishReason, Request
from tokenmill.sampling_params import SamplingParams


def _core(num_blocks=64, block_size=4, budget=64, clock=None, executor=None, **sched) -> EngineCore:
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=16, max_model_len=256, **sched)
    return EngineCore(cfg, KVCacheManager(num_blocks, block_size), executor or DryRunExecutor(token_id=7),
                      clock or ManualClock())


def _req(rid, n_prompt=10, max_tokens=5, eos=None, arrival=0.0, **params) -> Request:
    return Request(rid, list(range(1, n_prompt + 1)), SamplingParams(max_tokens=max_tokens, **params),
                   eos_token_id=eos, arrival_time=arrival, max_tokens=max_tokens)


def test_core_imports_neither_torch_nor_numpy():
    code = ("import sys, tokenmill.core.engine_core, tokenmill.core.dry_run, tokenmill.core.clock, tokenmill.config; "
            "bad = [m for m in ('torch', 'numpy') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_events_are_stamped_with_the_injected_clock():
    """Every timestamp and step time comes from the clock the core was given: a simulated clock
    that the executor advances by a step cost gives exact, machine-independent latencies."""
    clock = ManualClock(100.0)
    executor = DryRunExecutor(token_id=7, clock=clock, step_cost=lambda out: 0.001 * out.total_num_scheduled_tokens)
    core = _core(clock=clock, executor=executor)
    req = _req("a", n_prompt=10, max_tokens=3, arrival=100.0)
    core.add_request(req)
    steps = []
    while core.has_unfinished_requests():
        steps.append(core.step())
    assert [o.new_token_ids for s in steps for o in s.outputs] == [[7], [7], [7]]
    ev = req.events
    assert ev.first_scheduled == 100.0 and abs(ev.first_token - 100.010) < 1e-9  # 10 prompt tokens at 1 ms each
    assert abs(ev.finished - 100.012) < 1e-9 and req.finish_reason == FinishReason.LENGTH
    assert abs(steps[0].iteration.step_time - 0.010) < 1e-9 and steps[0].iteration.num_prompt_tokens == 10


def test_stop_checks_belong_to_the_core():
    core = _core()
    core.add_request(_req("eos", max_tokens=10, eos=7))
    core.add_request(_req("eos-ignored", max_tokens=3, eos=7, ignore_eos=True))
    core.add_request(_req("stop-id", max_tokens=10, stop_token_ids=[7]))
    core.add_request(_req("min", max_tokens=10, eos=7, min_tokens=2))
    done = {}
    while core.has_unfinished_requests():
        for out in core.step().outputs:
            if out.finish_reason is not None:
                done[out.request_id] = (out.finish_reason, out.stop_reason, out.events.finished is not None)
    assert done == {"eos": (FinishReason.STOP, None, True), "eos-ignored": (FinishReason.LENGTH, None, True),
                    "stop-id": (FinishReason.STOP, 7, True), "min": (FinishReason.STOP, None, True)}
    assert core.kv.pool.num_used_blocks == 0


def test_finish_requests_frees_at_once_and_tells_the_executor():
    executor = DryRunExecutor()
    core = _core(executor=executor)
    core.add_request(_req("a", max_tokens=50))
    core.add_request(_req("b", max_tokens=50))
    core.step()
    ended = core.finish_requests(["a", "missing"], FinishReason.STOP, stop_reason="END")
    assert [r.request_id for r in ended] == ["a"] and ended[0].stop_reason == "END"
    assert core.kv.block_ids("a") == [] and "a" in executor.num_tokens
    core.step()
    assert "a" not in executor.num_tokens  # finished ids reach the executor with the next step


def test_scheduler_output_is_plain_data_that_pickles():
    seen = []

    class Recording(DryRunExecutor):
        def execute(self, out):
            seen.append(pickle.loads(pickle.dumps(out)))
            return super().execute(out)

    core = _core(executor=Recording())
    core.add_request(_req("a", n_prompt=9, max_tokens=2))
    while core.has_unfinished_requests():
        core.step()
    first, second = seen[0], seen[1]
    assert [n.request_id for n in first.new_requests] == ["a"] and first.new_requests[0].block_ids == [0, 1, 2]
    assert first.num_scheduled_tokens == {"a": 9}
    assert second.cached_requests[0].request_id == "a" and second.cached_requests[0].num_computed_tokens == 9
    assert second.cached_requests[0].new_block_ids == []  # token 10 still fits in block 2


def test_preempted_request_comes_back_whole():
    """Under memory pressure the newest request is preempted; the executor is told to drop it and
    later receives it again as a new request carrying the tokens it had already produced."""
    seen = []

    class Recording(DryRunExecutor):
        def execute(self, out):
            seen.append(out)
            return super().execute(out)

    core = _core(num_blocks=6, block_size=4, budget=64, executor=Recording())
    core.add_request(_req("a", n_prompt=8, max_tokens=12))
    core.add_request(_req("b", n_prompt=8, max_tokens=12))
    while core.has_unfinished_requests():
        core.step()
    assert core.scheduler.num_preemptions >= 1
    preempted = next(out for out in seen if out.preempted_request_ids)
    rid = preempted.preempted_request_ids[0]
    resumed = next(n for out in seen[seen.index(preempted):] for n in out.new_requests if n.request_id == rid)
    # it resumes with the tokens it produced; its own blocks written before the preemption are
    # found again in the prefix cache (whole blocks only)
    assert resumed.output_token_ids and resumed.num_computed_tokens % 4 == 0
    assert resumed.num_computed_tokens < len(resumed.prompt_token_ids) + len(resumed.output_token_ids)
    assert core.kv.pool.num_used_blocks == 0


def test_executor_can_return_several_tokens_and_the_core_stops_mid_list():
    """Speculative executors return more than one token; a stop inside the list ends the request
    there and the rest is dropped."""

    class Burst:
        def execute(self, out):
            ids = list(out.num_scheduled_tokens)
            return ModelRunnerOutput(ids, [[5, 9, 5] for _ in ids])

    core = _core(executor=Burst())
    core.add_request(_req("a", max_tokens=10, stop_token_ids=[9]))
    result = core.step()
    assert result.outputs[0].new_token_ids == [5, 9] and result.outputs[0].finish_reason == FinishReason.STOP


def test_a_request_step_error_ends_only_its_requests():
    """The executor fails a step for one request: it ends with ERROR and its blocks are freed; the
    others run the same tokens again and finish as if nothing happened. An error naming nobody
    known is fatal (retrying would fail forever)."""
    import pytest

    from tokenmill.core.errors import RequestStepError

    class Flaky(DryRunExecutor):
        fail: list[str] | None = None

        def execute(self, out):
            if self.fail is not None:
                bad, self.fail = self.fail, None
                raise RequestStepError(bad, "boom")
            return super().execute(out)

    ex = Flaky(token_id=7)
    core = _core(executor=ex)
    for rid in ("a", "b"):
        core.add_request(_req(rid, max_tokens=3))
    core.step()  # prefill both
    ex.fail = ["b"]
    step = core.step()
    assert [(o.request_id, o.finish_reason) for o in step.outputs] == [("b", FinishReason.ERROR)]
    assert step.finished_requests[0].request_id == "b"
    tokens = []
    while core.has_unfinished_requests():
        tokens += [t for o in core.step().outputs for t in o.new_token_ids]
    assert tokens == [7, 7] and core.kv.pool.num_used_blocks == 0  # a's 2 remaining tokens, nothing leaked
    core.add_request(_req("c"))
    ex.fail = ["nobody"]
    with pytest.raises(RuntimeError):
        core.step()
