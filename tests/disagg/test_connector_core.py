"""The KV connector's scheduler half inside the real EngineCore, torch-free: a prefill core and a
decode core joined by a fake worker half (tests/disagg/fake_transfer.py). Checks the request
states, delayed freeing, timeouts, recompute on failure, prefix hits on the receiver, and that the
decode side's output equals a colocated core's."""
from __future__ import annotations

import subprocess
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenmill.core.clock import ManualClock
from tokenmill.core.engine_core import EngineCore
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.disagg.handover_scheduler import HandoverConnectorScheduler
from tokenmill.request import Request, RequestStatus
from tokenmill.sampling_params import SamplingParams

from .fake_transfer import FakeRegion, FakeWorker, SlotExecutor

BS, BLOCKS, KEY = 4, 64, "model-x"


class Engine:
    def __init__(self, role: str | None, region: FakeRegion, clock: ManualClock, corrupt: bool = False,
                 timeout_s: float = 10.0) -> None:
        self.executor = SlotExecutor(BLOCKS, BS)
        conn = HandoverConnectorScheduler(BS, KEY, timeout_s, vocab_size=1000) if role else None
        if role:
            self.executor.worker = FakeWorker(region, self.executor, clock, corrupt)
        self.kv = KVCacheManager(BLOCKS, BS)
        self.core = EngineCore(SchedulerConfig(max_num_batched_tokens=64, max_model_len=200), self.kv,
                               self.executor, clock, kv_connector=conn)
        self.stats = []

    def run(self, rid: str, prompt: list[int], max_tokens: int, **kv) -> tuple[list[int], dict | None]:
        req = Request(rid, prompt, SamplingParams(max_tokens=max_tokens, kv_transfer_params=kv or None),
                      max_tokens=max_tokens)
        self.core.add_request(req)
        tokens, params = [], None
        while not req.is_finished:
            step = self.core.step()
            self.stats.append(step.iteration.kv_transfer)
            for out in step.outputs:
                tokens += out.new_token_ids
                params = out.kv_transfer_params or params
        return tokens, params

    def settle(self, n: int = 3) -> None:
        for _ in range(n):
            self.stats.append(self.core.step().iteration.kv_transfer)

    def recomputes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for st_ in self.stats:
            for k, v in (st_.recomputes.items() if st_ else []):
                out[k] = out.get(k, 0) + v
        return out


def _pair(**kw):
    region, clock = FakeRegion(), ManualClock()
    return Engine("prefill", region, clock, **kw), Engine("decode", region, clock), Engine(None, region, clock), clock


PROMPT = list(range(1, 23))  # 22 tokens: 5 full blocks and a partial one


def test_core_and_connector_scheduler_import_no_torch():
    code = ("import sys, tokenmill.core.engine_core, tokenmill.disagg.connector, tokenmill.disagg.handover_scheduler, "
            "tokenmill.disagg.policy; bad = [m for m in ('torch', 'numpy') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_handover_matches_colocated_and_frees_after_ack():
    p, d, c, _ = _pair()
    want, _ = c.run("c", PROMPT, 6)
    first, params = p.run("p", PROMPT, 1, do_remote_decode=True)
    assert first == want[:1] and params["num_tokens"] == len(PROMPT) and params["first_token_id"] == want[0]
    assert p.kv.pool.num_used_blocks == 6 and p.core.has_pending_kv_transfers()  # held for the receiver
    req = Request("d", PROMPT, SamplingParams(max_tokens=6, kv_transfer_params=params), max_tokens=6)
    d.core.add_request(req)
    first_step = d.core.step()  # plans the load (the request waits, unscheduled), the worker copies
    sched = d.executor.steps[-1]
    assert not sched.num_scheduled_tokens and len(sched.kv_connector_metadata.loads[0].local_block_ids) == 6
    assert req.status == RequestStatus.RUNNING and req.num_computed_tokens == len(PROMPT)
    tokens = [t for o in first_step.outputs for t in o.new_token_ids]  # the adopted first token
    while not req.is_finished:
        tokens += [t for o in d.core.step().outputs for t in o.new_token_ids]
    assert tokens == want
    assert d.executor.num_computed_tokens == len(want) - 1  # only decode steps: the prompt's KV came over
    p.settle()
    assert p.kv.pool.num_used_blocks == 0 and not p.core.has_pending_kv_transfers()
    assert d.kv.pool.num_used_blocks == 0


def test_sender_timeout_frees_and_receiver_recomputes():
    p, d, c, clock = _pair(timeout_s=5.0)
    want, _ = c.run("c", PROMPT, 4)
    _, params = p.run("p", PROMPT, 1, do_remote_decode=True)
    clock.advance(6.0)
    p.settle()
    assert p.kv.pool.num_used_blocks == 0
    got, _ = d.run("d", PROMPT, 4, **params)
    assert got == want and d.recomputes() == {"lease_expired": 1}
    assert d.executor.num_computed_tokens == len(PROMPT) + 3  # the prompt was computed here


def test_corrupt_copy_recomputes_and_still_acks():
    region, clock = FakeRegion(), ManualClock()
    p, d, c = Engine("prefill", region, clock), Engine("decode", region, clock, corrupt=True), Engine(None, region, clock)
    want, _ = c.run("c", PROMPT, 4)
    _, params = p.run("p", PROMPT, 1, do_remote_decode=True)
    got, _ = d.run("d", PROMPT, 4, **params)
    assert got == want and d.recomputes() == {"checksum_mismatch": 1}
    p.settle()
    assert p.kv.pool.num_used_blocks == 0 and d.kv.pool.num_used_blocks == 0


def test_receiver_prefix_hit_loads_only_the_rest():
    p, d, c, _ = _pair()
    d.run("warm", PROMPT[:12] + [99, 98], 1)  # the decode side caches PROMPT's first 3 blocks
    computed = d.executor.num_computed_tokens
    want, _ = c.run("c", PROMPT, 4)
    _, params = p.run("p", PROMPT, 1, do_remote_decode=True)
    got, _ = d.run("d", PROMPT, 4, **params)
    assert got == want and d.executor.num_computed_tokens - computed == 3
    loaded = [r for s in d.stats if s for r in s.received]
    assert len(loaded) == 1 and loaded[0].num_bytes == 3 * 8  # blocks 3, 4, 5 only


def test_mismatched_prompt_recomputes():
    p, d, c, _ = _pair()
    _, params = p.run("p", PROMPT, 1, do_remote_decode=True)
    other = PROMPT[:-1] + [77]
    want, _ = c.run("c", other, 3)
    got, _ = d.run("d", other, 3, **params)
    assert got == want and d.recomputes() == {"prompt_mismatch": 1}
    p.settle()
    assert p.kv.pool.num_used_blocks == 0  # the refusal still acked the sender


def test_forged_parameters_recompute_and_never_break_the_engine():
    p, d, c, _ = _pair()
    _, params = p.run("p", PROMPT, 1, do_remote_decode=True)
    want, _ = c.run("c", PROMPT, 3)
    for i, bad in enumerate([{"first_token_id": "x"}, {"first_token_id": 10**9}, {"num_tokens": "22"},
                             {"block_checksums": 5}, {"transfer_id": "t"}]):
        got, _ = d.run(f"d{i}", PROMPT, 3, **{**params, **bad})
        assert got == want
    assert d.recomputes() == {"bad_params": 2, "prompt_mismatch": 1, "error": 1, "lease_expired": 1}


def test_abort_while_waiting_for_remote_kv_frees():
    p, d, _, _ = _pair()
    _, params = p.run("p", PROMPT, 1, do_remote_decode=True)
    req = Request("d", PROMPT, SamplingParams(max_tokens=3, kv_transfer_params=params), max_tokens=3)
    d.core.add_request(req)
    sched = d.core.scheduler.schedule()
    assert req.status == RequestStatus.WAITING_FOR_REMOTE_KV and d.kv.pool.num_used_blocks == 6
    d.core.finish_requests(["d"])
    assert d.kv.pool.num_used_blocks == 0 and not d.core.has_unfinished_requests()
    assert sched.kv_connector_metadata.loads


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(2, 40), st.sampled_from(["ok", "timeout", "corrupt", "mismatch"]),
                          st.integers(1, 5)), min_size=1, max_size=6))
def test_any_mix_of_outcomes_matches_colocated_and_leaks_nothing(cases):
    region, clock = FakeRegion(), ManualClock()
    p, c = Engine("prefill", region, clock, timeout_s=5.0), Engine(None, region, clock)
    d_ok, d_bad = Engine("decode", region, clock), Engine("decode", region, clock, corrupt=True)
    for i, (n, outcome, max_tokens) in enumerate(cases):
        prompt = [(i * 31 + j) % 50 + 1 for j in range(n)]
        want, _ = c.run(f"c{i}", prompt, max_tokens)
        _, params = p.run(f"p{i}", prompt, 1, do_remote_decode=True)
        if outcome == "timeout":
            clock.advance(6.0)
            p.settle()
        d = d_bad if outcome == "corrupt" else d_ok
        asked = prompt if outcome != "mismatch" else prompt[:-1] + [99]
        if outcome == "mismatch":
            want, _ = c.run(f"m{i}", asked, max_tokens)
        got, _ = d.run(f"d{i}", asked, max_tokens, **params)
        assert got == want
    p.settle()
    for e in (p, d_ok, d_bad, c):
        assert e.kv.pool.num_used_blocks == 0 and not e.core.has_unfinished_requests()
