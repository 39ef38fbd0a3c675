"""The serving-path terms (`ServingOverhead`): the calibration fit recovers planted terms, the terms
round-trip through a profile JSON, and the simulator applies them where the server pays them
(admission before the scheduler, streaming inside every step that gives tokens). No timing here."""
import json
from dataclasses import asdict

import numpy as np
import pytest

from tokenmill.sim.hardware import profile_perf_model
from tokenmill.sim.perf_model import BatchShape, PerfModel, ServingOverhead, batch_shape
from tokenmill.sim.serve_profile import Probe, design_row, fit_serving, probes_of
from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.core.scheduler_output import SchedulerOutput
from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.perf_model import PerfCoefficients
from tokenmill.sim.simulator import ClusterSimulator, ReplicaSpec, SimRequest

SHAPE = ModelShape("toy", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                   intermediate_size=128, vocab_size=1000)
COEFF = PerfCoefficients(linear_flops_per_s=1e30, attention_flops_per_s=1e30, mem_bytes_per_s=1e30,
                         step_overhead_s=0.001, per_token_s=0.001)  # 1 ms per step + 1 ms per token

pytest.importorskip("scipy")

PLANTED = ServingOverhead(admit_s=0.004, admit_per_prompt_token_s=2e-6, stream_per_step_s=3e-4, stream_per_seq_s=1.2e-3)


def _planted_probes(noise: float, seed: int = 0) -> list[Probe]:
    rng = np.random.default_rng(seed)
    terms = np.array([PLANTED.admit_s, PLANTED.admit_per_prompt_token_s, PLANTED.stream_per_step_s,
                      PLANTED.stream_per_seq_s])
    probes = []
    for kind, size, engine_s in [("admit", 16, 0.02), ("admit", 256, 0.25), ("admit", 1024, 1.3),
                                 ("stream", 1, 0.009), ("stream", 4, 0.012), ("stream", 8, 0.018),
                                 ("stream", 16, 0.03)]:
        extra = float(np.dot(design_row(Probe(kind, size, 0, 0)), terms))
        probes.append(Probe(kind, size, (engine_s + extra) * (1 + noise * rng.standard_normal()), engine_s))
    return probes


def test_fit_recovers_planted_terms_exactly_without_noise():
    got = fit_serving(_planted_probes(0.0))
    for name, want in asdict(PLANTED).items():
        assert getattr(got, name) == pytest.approx(want, rel=1e-6, abs=1e-9), name


def test_fit_predicts_planted_residuals_within_noise():
    probes = _planted_probes(0.01, seed=3)
    got = fit_serving(probes)
    terms = [got.admit_s, got.admit_per_prompt_token_s, got.stream_per_step_s, got.stream_per_seq_s]
    for p in probes:  # 1% noise on the measured side: predictions within a few % of it
        assert p.simulated_s + np.dot(design_row(p), terms) == pytest.approx(p.measured_s, rel=0.05)
    assert got.stream_per_seq_s == pytest.approx(PLANTED.stream_per_seq_s, rel=0.2)


def test_fit_needs_both_kinds_and_terms_stay_nonnegative():
    with pytest.raises(ValueError, match="admission and streaming"):
        fit_serving([p for p in _planted_probes(0.0) if p.kind == "stream"])
    # the server faster than the engine-only model: terms clip at zero, never negative
    fast = [Probe(p.kind, p.size, p.simulated_s * 0.9, p.simulated_s) for p in _planted_probes(0.0)]
    assert all(v >= 0 for v in asdict(fit_serving(fast)).values())
    with pytest.raises(ValueError, match="serving.admit_s"):
        ServingOverhead(admit_s=-1.0)


def test_probes_are_medians_per_kind_and_size():
    from tokenmill.sim.serve_profile import _Sent
    sent = [_Sent("admit", 16, "p", 2, ttft_s=t) for t in (0.01, 0.03, 0.02)]
    sent += [_Sent("stream", 4, "p", 8, tpot_s=t) for t in (0.02, 0.04)]
    simulated = [(0.005, None), (0.006, None), (0.007, None), (0.1, 0.01), (0.1, 0.02)]
    assert probes_of(sent, simulated) == [Probe("admit", 16, 0.02, 0.006), Probe("stream", 4, 0.03, 0.015)]


def test_profile_json_round_trip(tmp_path):
    from tokenmill.sim.hardware import load_profile
    profile = load_profile()
    profile["serving"] = {"terms": asdict(PLANTED), "probes": []}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile))
    m = profile_perf_model(load_profile(path))
    assert m.serving == PLANTED
    engine_only = profile_perf_model({k: v for k, v in profile.items() if k != "serving"})
    b = BatchShape(num_decode_tokens=4, num_seqs=4, attention_pairs=400, kv_tokens_read=400, num_output_seqs=4)
    assert m.step_time(b) - engine_only.step_time(b) == pytest.approx(PLANTED.stream_per_step_s + 4 * PLANTED.stream_per_seq_s)
    assert m.breakdown(b)["serving"] == pytest.approx(PLANTED.stream_s(4))


def test_simulator_pays_admission_before_the_scheduler_and_streaming_per_step():
    serving = ServingOverhead(admit_s=0.010, admit_per_prompt_token_s=1e-4, stream_per_step_s=5e-4, stream_per_seq_s=1e-3)
    spec = ReplicaSpec(PerfModel(SHAPE, COEFF, serving=serving), SchedulerConfig(max_num_batched_tokens=256), 256)
    [r] = ClusterSimulator([spec]).run([SimRequest("a", 1.0, list(range(32)), 3)])
    admission = 0.010 + 32 * 1e-4
    step_stream = 5e-4 + 1e-3  # one request given a token per step
    # engine: prefill 1 + 32 ms, decodes 1 + 1 ms
    assert r.ttft == pytest.approx(admission + 0.033 + step_stream)
    assert np.diff(r.token_times) == pytest.approx([0.002 + step_stream] * 2)


def test_a_prompt_chunk_streams_nothing():
    out = SchedulerOutput(num_scheduled_tokens={"a": 16, "b": 16, "c": 1})
    shape = batch_shape(out, {"a": 0, "b": 16, "c": 40}, {"a": 32, "b": 32, "c": 40})
    assert (shape.num_prefill_tokens, shape.num_decode_tokens, shape.num_output_seqs) == (32, 1, 2)
