"""Sliding-window block freeing (torch-free): with every layer attending to its last W tokens, a
block wholly before the window of every token still to be computed goes back to the pool. Random
traffic through the real EngineCore: refcounts always equal the references held, every block a
scheduled token can see is still owned, freed ones are gone, and nothing leaks."""
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kv_cache_manager import _req, check_invariants

from tokenmill.core.block_pool import NULL_BLOCK
from tokenmill.core.dry_run import DryRunExecutor
from tokenmill.core.engine_core import EngineCore
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.scheduler import SchedulerConfig


class WindowCheckingExecutor(DryRunExecutor):
    """Checks, for every scheduled request, that the blocks its new tokens can see are owned."""

    def __init__(self, kv: KVCacheManager, window: int) -> None:
        super().__init__()
        self.kv, self.window = kv, window

    def execute(self, out):
        computed = {n.request_id: n.num_computed_tokens for n in out.new_requests}
        computed.update({c.request_id: c.num_computed_tokens for c in out.cached_requests})
        bs = self.kv.block_size
        for rid, n in out.num_scheduled_tokens.items():
            blocks = self.kv.req_blocks[rid]
            first_seen = max(0, computed[rid] - self.window + 1)  # the earliest key any new token sees
            for i, b in enumerate(blocks):
                if (i + 1) * bs <= first_seen:
                    continue  # may be freed (is, once the request allocated after reaching here)
                if i * bs < computed[rid] + n:
                    assert b is not NULL_BLOCK, f"block {i} of {rid} is visible but was freed"
            # what allocation freed is exactly what no future token can see
            for i, b in enumerate(blocks):
                if b is NULL_BLOCK:
                    assert (i + 1) * bs <= first_seen
        return super().execute(out)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "step", "step", "step", "abort"]),
                              st.integers(0, 3), st.integers(1, 40), st.integers(1, 30)),
                    min_size=1, max_size=60),
       num_blocks=st.integers(10, 40), block_size=st.sampled_from([1, 2, 4, 8]), window=st.integers(1, 20),
       budget=st.integers(1, 32), caching=st.booleans())
def test_random_traffic_with_a_window_frees_early_and_never_leaks(ops, num_blocks, block_size, window, budget,
                                                                 caching):
    kv = KVCacheManager(num_blocks, block_size, enable_caching=caching, sliding_window=window)
    core = EngineCore(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=10_000), kv,
                      WindowCheckingExecutor(kv, window))
    prefixes = [[1] * 12, [2] * 12, [1] * 6 + [3] * 6, []]
    live: list[str] = []
    n = 0
    at_once = -(-(window + budget) // block_size) + 1  # blocks a request can hold at once
    for op, pfx, length, max_tokens in ops:
        if op == "add":
            tokens = (prefixes[pfx] + list(range(100 + n, 100 + n + length)))[: max(1, length + 6)]
            if min(-(-(len(tokens) + max_tokens) // block_size), at_once) > num_blocks:
                continue
            core.add_request(_req(str(n), tokens, max_tokens))
            live.append(str(n))
            n += 1
        elif op == "abort" and live:
            core.finish_requests([live.pop(pfx % len(live))])
        else:
            _step(core, live, at_once)
        check_invariants(kv)
    for _ in range(3000):
        if not core.has_unfinished_requests():
            break
        _step(core, live, at_once)
        check_invariants(kv)
    assert not core.has_unfinished_requests(), "scheduler stalled"
    assert kv.pool.num_free_blocks == num_blocks and not kv.req_blocks


def _step(core: EngineCore, live: list[str], at_once: int) -> None:
    for out in core.step().outputs:
        if out.finish_reason is not None:
            live.remove(out.request_id)
    for req in core.scheduler.running:  # a request holds its window and one step's tokens, never more
        held = sum(b is not NULL_BLOCK for b in core.kv.req_blocks.get(req.request_id, []))
        assert held <= at_once + 1, (held, at_once, req)


def test_a_cached_prompt_longer_than_the_pool_is_admitted_with_a_window():
    """Regression (hypothesis, seed 5): a 13-token prompt whose first 12 tokens are cached, window 1,
    a 12-block pool. Adopting all 12 cached blocks would need 13 free blocks and the request waited
    forever; only the block the next token sees is taken."""
    kv = KVCacheManager(12, 1, enable_caching=True, sliding_window=1)
    core = EngineCore(SchedulerConfig(max_num_batched_tokens=1, max_num_seqs=8, max_model_len=100), kv,
                      WindowCheckingExecutor(kv, 1))
    core.add_request(_req("a", [1] * 12, 1))
    core.add_request(_req("b", [1] * 12 + [101], 1))
    for _ in range(100):
        if not core.has_unfinished_requests():
            break
        core.step()
        check_invariants(kv)
    assert not core.has_unfinished_requests()
    assert core.scheduler.requests == {} and kv.pool.num_free_blocks == 12
    assert kv.prefix_stats.hits >= 11  # b really reused a's cached prefix
