"""Per-request device-seconds (what the cost ledger bills): every engine step's time is split over
the requests in it by their share of the step's tokens, so the charges of all requests sum to the
engine's busy seconds, and a request's prompt tokens are billed to its prefill part."""
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.core.clock import ManualClock
from tokenmill.core.dry_run import DryRunExecutor
from tokenmill.core.engine_core import EngineCore
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams


def _run(requests: list[tuple[int, int]], budget: int, num_blocks: int):
    clock = ManualClock()
    # a step costs 2 ms + 1 ms per token: each token of a step is charged 1/total of all of it
    executor = DryRunExecutor(token_id=7, clock=clock,
                              step_cost=lambda out: 0.002 + 0.001 * out.total_num_scheduled_tokens)
    core = EngineCore(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=128),
                      KVCacheManager(num_blocks, 4), executor, clock)
    reqs = [Request(f"r{i}", list(range(1, p + 1)), SamplingParams(max_tokens=m), eos_token_id=None,
                    arrival_time=0.0, max_tokens=m) for i, (p, m) in enumerate(requests)]
    for r in reqs:
        core.add_request(r)
    busy = 0.0
    while core.has_unfinished_requests():
        busy += core.step().iteration.step_time
    return reqs, busy


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=6),
       st.integers(8, 64), st.integers(13, 40))
def test_charges_sum_to_busy_seconds(requests, budget, num_blocks):
    """Chunked prefill, batching and preemption (few blocks) included: nothing is lost or billed twice.
    At least 13 blocks of 4: the longest request (40 + 12 tokens) must fit alone, as the engine's
    request validation guarantees (this test drives EngineCore directly, without it)."""
    reqs, busy = _run(requests, budget, num_blocks)
    assert busy > 0
    assert abs(sum(r.events.device_seconds for r in reqs) - busy) <= 1e-9 * max(1.0, busy)
    assert all(r.events.prefill_device_seconds > 0 and r.events.decode_device_seconds >= 0 for r in reqs)


def test_alone_a_request_pays_every_step_and_prompt_tokens_go_to_prefill():
    (req,), busy = _run([(10, 3)], budget=64, num_blocks=32)
    # step 1: the 10 prompt tokens (12 ms, the first token sampled); steps 2 and 3: one decode token each (3 ms)
    assert abs(req.events.prefill_device_seconds - 0.012) < 1e-12
    assert abs(req.events.decode_device_seconds - 0.006) < 1e-12 and abs(busy - 0.018) < 1e-12


def test_two_requests_split_a_shared_step_by_tokens():
    (a, b), _ = _run([(30, 1), (10, 1)], budget=64, num_blocks=32)
    # one step of 40 tokens costs 42 ms: 3/4 of it to a, 1/4 to b
    assert abs(a.events.prefill_device_seconds - 0.042 * 30 / 40) < 1e-12
    assert abs(b.events.prefill_device_seconds - 0.042 * 10 / 40) < 1e-12
