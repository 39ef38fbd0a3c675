"""one_prompt_end_per_step: a step that ends a prompt takes no other prompt's chunk (decodes still
ride along), so that prompt's first token is not held back by a newcomer's prefill. Torch-free,
on EngineCore with a dry-run executor and a step cost of 1 ms per token."""
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.core.clock import ManualClock
from tokenmill.core.dry_run import DryRunExecutor
from tokenmill.core.engine_core import EngineCore
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams


class RecordingExecutor(DryRunExecutor):
    """Keeps what each step scheduled: request id -> tokens."""

    def execute(self, sched):
        self.last = dict(sched.num_scheduled_tokens)
        return super().execute(sched)


def _core(on: bool, budget: int = 64, num_blocks: int = 128) -> tuple[EngineCore, ManualClock]:
    clock = ManualClock()
    executor = RecordingExecutor(token_id=7, clock=clock, step_cost=lambda out: 0.001 * out.total_num_scheduled_tokens)
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=16, max_model_len=512,
                          one_prompt_end_per_step=on)
    return EngineCore(cfg, KVCacheManager(num_blocks, 4), executor, clock), clock


def _req(rid: str, n_prompt: int, max_tokens: int = 3) -> Request:
    first = 1 + 1000 * sum(map(ord, rid))  # no two requests share a prefix (no prefix-cache hits)
    return Request(rid, list(range(first, first + n_prompt)), SamplingParams(max_tokens=max_tokens), arrival_time=0.0,
                   max_tokens=max_tokens)


def _scheduled(core: EngineCore) -> dict[str, int]:
    core.step()
    return core.executor.last


def test_two_prompts_that_fit_one_step_run_one_after_the_other():
    core, _ = _core(on=True)
    a, b = _req("a", 20), _req("b", 30)
    core.add_request(a)
    core.add_request(b)
    assert _scheduled(core) == {"a": 20}  # a ends its prompt: b waits
    assert _scheduled(core) == {"a": 1, "b": 30}  # a's decode rides along with b's prompt
    assert abs(a.events.first_token - 0.020) < 1e-9 and abs(b.events.first_token - 0.051) < 1e-9


def test_off_packs_both_prompts_into_one_step():
    core, _ = _core(on=False)
    a, b = _req("a", 20), _req("b", 30)
    core.add_request(a)
    core.add_request(b)
    assert _scheduled(core) == {"a": 20, "b": 30}
    assert abs(a.events.first_token - 0.050) < 1e-9  # a waits for b's prompt too


def test_a_long_prompts_last_chunk_is_not_joined_by_a_newcomer():
    """The case seen online: a prompt over the budget ends in its second step; a request that arrived
    meanwhile starts in the step after, not inside that second step."""
    core, _ = _core(on=True, budget=64)
    long, late = _req("long", 100), _req("late", 40)
    core.add_request(long)
    assert _scheduled(core) == {"long": 64}
    core.add_request(late)
    assert _scheduled(core) == {"long": 36}
    assert _scheduled(core) == {"long": 1, "late": 40}


def test_a_chunk_that_does_not_end_its_prompt_leaves_room_for_others():
    """Only a prompt's last chunk closes the step: a partial chunk (the budget cut it) does not, and
    decodes and a prompt that fits all run together while nobody's prompt ends before them."""
    core, _ = _core(on=True, budget=64)
    a = _req("a", 10, max_tokens=10)
    core.add_request(a)
    _scheduled(core)
    b, c = _req("b", 100), _req("c", 10)
    core.add_request(b)
    core.add_request(c)
    assert _scheduled(core) == {"a": 1, "b": 63}  # b's chunk is cut by the budget, not ended
    assert _scheduled(core) == {"a": 1, "b": 37}  # b ends: c waits
    assert _scheduled(core) == {"a": 1, "b": 1, "c": 10}


@settings(max_examples=40, deadline=None)
@given(prompts=st.lists(st.integers(1, 150), min_size=1, max_size=8), budget=st.integers(8, 128),
       on=st.booleans())
def test_every_request_finishes_and_no_block_leaks(prompts, budget, on):
    """Whatever the prompt lengths and budget, with the rule on or off: every request gets all its
    tokens, at most one prompt ends per step when on, and the KV pool is whole again at the end."""
    core, _ = _core(on=on, budget=budget, num_blocks=512)
    reqs = [_req(f"r{i}", n) for i, n in enumerate(prompts)]
    for r in reqs:
        core.add_request(r)
    for _ in range(10_000):
        if not core.has_unfinished_requests():
            break
        scheduled = _scheduled(core)
        ends = [rid for rid, n in scheduled.items()
                if n > 1 and next(r for r in reqs if r.request_id == rid).num_output_tokens == 1]
        assert not on or len(ends) <= 1
    assert all(len(r.output_token_ids) == 3 for r in reqs)
    assert core.scheduler.kv.pool.num_used_blocks == 0


def test_serve_turns_it_on_and_offline_engines_do_not(tiny_llama):
    """A server is judged on TTFT; offline, packing prompts is the faster order. The flag reaches the
    scheduler's config."""
    from tokenmill.config import EngineConfig
    from tokenmill.engine.resolve import resolve_config
    from tokenmill.server.cli_args import engine_config_from_args, make_parser
    assert not EngineConfig().one_prompt_end_per_step
    parser = make_parser()
    served = engine_config_from_args(parser.parse_args(["--model", str(tiny_llama), "--dtype", "float32"]))
    assert served.one_prompt_end_per_step and resolve_config(served).scheduler.one_prompt_end_per_step
    assert not engine_config_from_args(parser.parse_args(["--model", str(tiny_llama),
                                                          "--no-one-prompt-end-per-step"])).one_prompt_end_per_step
    assert not resolve_config(EngineConfig(model=str(tiny_llama), dtype="float32")).scheduler.one_prompt_end_per_step


def test_serve_takes_vllms_cpu_server_budget(tiny_llama):
    """`tokenmill serve` steps take up to 2048 tokens (vLLM's default for its CPU API server), offline
    engines 1024; the flag still overrides it and reaches the scheduler."""
    from tokenmill.config import EngineConfig
    from tokenmill.engine.resolve import resolve_config
    from tokenmill.server.cli_args import engine_config_from_args, make_parser
    parser = make_parser()
    served = engine_config_from_args(parser.parse_args(["--model", str(tiny_llama), "--dtype", "float32"]))
    assert served.max_num_batched_tokens == 2048 == resolve_config(served).scheduler.max_num_batched_tokens
    assert "default: 2048" in parser.format_help().replace("\n", " ").replace("  ", " ")
    assert engine_config_from_args(parser.parse_args(["--model", str(tiny_llama), "--max-num-batched-tokens",
                                                      "512"])).max_num_batched_tokens == 512
    assert EngineConfig().max_num_batched_tokens == 1024


def test_the_simulator_schedules_as_serve_when_asked():
    """`tokenmill sim run --one-prompt-end-per-step` hands the rule to the simulated replicas' scheduler
    (sim validate asks for it: the server it is compared with runs it); off by default (vLLM's packing)."""
    import argparse

    from tokenmill.sim.args import add_cluster_args, add_scheduler_args, cluster_config
    p = argparse.ArgumentParser()
    add_scheduler_args(p)
    add_cluster_args(p)
    assert not cluster_config(p.parse_args([])).scheduler().one_prompt_end_per_step
    assert cluster_config(p.parse_args(["--one-prompt-end-per-step"])).scheduler().one_prompt_end_per_step
