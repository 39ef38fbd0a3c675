"""The simulator's clock drives the same scheduling decisions as the real engine.

The real engine (tiny Llama, real ModelRunner, time.monotonic) runs a request log with arrivals
between steps, shared prefixes and a KV cache small enough to preempt; every step's batch (request
ids and token counts, in order) and its start time are recorded. The simulator then replays the
same requests at the same arrival times on one replica whose performance model returns the recorded
step durations: it must schedule the same batches in the same order."""
import time

import pytest

from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.sampling_params import SamplingParams
from tokenmill.sim.executor import PerfModelExecutor
from tokenmill.sim.perf_model import BatchShape
from tokenmill.sim.simulator import ClusterSimulator, ReplicaSpec, SimRequest


class RecordingExecutor:
    def __init__(self, inner, clock):
        self.inner, self.clock = inner, clock
        self.steps: list[tuple[float, tuple]] = []  # (start, batch)

    def execute(self, out):
        self.steps.append((self.clock(), tuple(out.num_scheduled_tokens.items())))
        return self.inner.execute(out)


class ReplayDurations:
    """A performance model that returns the recorded step durations, in order."""

    def __init__(self, durations, kv_bytes_per_token=1.0):
        self.durations = list(durations)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.shapes: list[BatchShape] = []

    def step_time(self, shape: BatchShape) -> float:
        self.shapes.append(shape)
        self.last = self.durations.pop(0)
        return self.last

    def breakdown(self, shape: BatchShape) -> dict[str, float]:
        return {"overhead": self.last, "linear_compute": 0.0, "attention_compute": 0.0, "communication": 0.0}


def _log():
    """(step index before which it arrives, request id, prompt ids, max_tokens)."""
    shared = list(range(100, 148))  # three full 16-token blocks shared by several prompts
    return [
        (0, "a", shared + list(range(1, 9)), 30),
        (0, "b", list(range(200, 240)), 30),
        (2, "c", shared + list(range(300, 310)), 25),
        (3, "d", list(range(400, 430)), 40),
        (5, "e", shared + list(range(30, 60)), 8),
        (5, "f", list(range(60, 65)), 14),
        (9, "g", shared + list(range(70, 71)), 5),
    ]


def test_simulator_schedules_the_real_engines_batches(tiny_llama):
    from tokenmill.engine.engine import LLMEngine

    engine = LLMEngine(model=str(tiny_llama), dtype="float32", num_kv_blocks=14, block_size=16,
                       max_num_batched_tokens=64, max_num_seqs=4, enable_prefix_caching=True)
    core = engine.core
    rec = RecordingExecutor(core.executor, core.clock)
    core.executor = rec
    arrivals = {}
    log = _log()
    step = 0
    woke: list[str] = []  # requests that arrived at an idle engine: the next step starts at their arrival
    while log or engine.has_unfinished_requests():
        now = core.clock()  # the requests added before one step arrive together
        idle = not engine.has_unfinished_requests()
        while log and log[0][0] <= step:
            _, rid, ids, max_tokens = log.pop(0)
            arrivals[rid] = now
            woke += [rid] if idle else []
            engine.add_request(rid, ids, SamplingParams(max_tokens=max_tokens, ignore_eos=True), arrival_time=now)
        time.sleep(0.001)  # arrivals strictly before the next step's start
        n_steps = len(rec.steps)
        engine.step()
        for rid in woke:
            arrivals[rid] = rec.steps[n_steps][0]
        woke = []
        step += 1
    real = [batch for _, batch in rec.steps]
    assert core.scheduler.num_preemptions > 0, "the log should exercise preemption"
    assert engine.core.prefix_stats.hits > 0, "the log should exercise the prefix cache"

    starts = [t for t, _ in rec.steps]
    t_end = core.clock()
    durations = [b - a for a, b in zip(starts, starts[1:] + [t_end])]
    perf = ReplayDurations(durations)
    spec = ReplicaSpec(perf, SchedulerConfig(64, 4, engine.max_model_len), num_kv_blocks=14, block_size=16)
    sim = ClusterSimulator([spec], "round-robin", record_steps=True)
    sim.replicas[0].clock.now = starts[0] - 1.0
    reqs = [SimRequest(rid, arrivals[rid], ids, max_tokens) for _, rid, ids, max_tokens in _log()]
    sim.run(reqs)
    simulated = [s.scheduled for s in sim.replicas[0].executor.steps]
    assert simulated == real
    assert sim.replicas[0].core.scheduler.num_preemptions == core.scheduler.num_preemptions


def test_executor_charges_no_compute_for_transferred_kv():
    from tokenmill.core.clock import ManualClock
    from tokenmill.core.scheduler_output import NewRequestData, SchedulerOutput

    perf = ReplayDurations([0.5])
    ex = PerfModelExecutor(perf, ManualClock())
    ex.remote_kv["r"] = 40
    out = SchedulerOutput(new_requests=[NewRequestData("r", list(range(41)), [], SamplingParams(), None, [0, 1, 2], 0)],
                          num_scheduled_tokens={"r": 41})
    ex.execute(out)
    assert perf.shapes[0] == BatchShape(num_prefill_tokens=1, num_decode_tokens=0, num_seqs=1,
                                        attention_pairs=41, kv_tokens_read=41, num_output_seqs=1)
    assert ex.clock.now == pytest.approx(0.5)
