"""`tokenmill sim profile`'s fit recovers a known model from its own step times (no timing here)."""
import numpy as np
import pytest

from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.perf_model import BatchShape, PerfCoefficients, PerfModel
from tokenmill.sim.profile import fit

pytest.importorskip("scipy")


def test_fit_recovers_known_coefficients(smollm2_folder):
    shape = ModelShape.from_folder(smollm2_folder)
    truth = PerfCoefficients(linear_flops_per_s=80e9, attention_flops_per_s=20e9, mem_bytes_per_s=20e9,
                             step_overhead_s=0.004, per_seq_s=2e-4, per_token_s=5e-5)
    model = PerfModel(shape, truth)
    rng = np.random.default_rng(0)
    shapes = []
    for _ in range(80):
        seqs = int(rng.integers(1, 48))
        ctx = int(rng.integers(16, 1500))
        prefill = int(rng.choice([0, 0, 16, 128, 512, 1024]))
        decode = seqs - (1 if prefill else 0)
        shapes.append(BatchShape(prefill, decode, seqs, decode * ctx + prefill * (prefill + 1) // 2,
                                 decode * ctx + prefill))
    samples = [(b, model.step_time(b) * (1 + 0.02 * rng.standard_normal())) for b in shapes]
    result = fit(shape, samples, truth.mem_bytes_per_s, "bfloat16", "bfloat16")
    fitted = PerfModel(shape, result.coeff)
    errors = [abs(fitted.step_time(b) / model.step_time(b) - 1) for b in shapes]
    assert result.median_abs_rel_err < 0.03
    assert max(errors) < 0.05
