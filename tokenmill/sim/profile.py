"""`tokenmill sim profile`: run the real engine over a grid of batch shapes on this machine, time
every step, and fit the performance model's coefficients (the only part of sim/ that loads torch).

Each grid point adds S requests of L random prompt tokens (no shared prefixes) and runs them to a
few output tokens through `LLMEngine.step()` (scheduler, model, sampling, detokenizing: what one
serving step costs), so the steps cover pure prefill chunks, prefill + decode mixes and decode
batches at several contexts. Memory bandwidth is measured separately (a large array copy) as the
fit's starting point; the fit finds it, the GEMM and attention rates and the overheads (least squares on
relative error). Each grid point runs several times and each step keeps its fastest run, so the
profile describes this machine unloaded (another job can only add time).
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import numpy as np

from tokenmill.core.outputs import ModelRunnerOutput
from tokenmill.core.scheduler_output import SchedulerOutput
from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.perf_model import BatchShape, PerfCoefficients, PerfModel, batch_shape

DEFAULT_GRID = ((16, 1), (16, 8), (16, 32), (128, 1), (128, 4), (128, 16), (128, 48),
                (512, 1), (512, 4), (512, 12), (1536, 2))


class ShapeRecorder:
    """Wraps the engine's executor: notes each step's batch shape on its way to the model."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.prompt_len: dict[str, int] = {}
        self.last: BatchShape | None = None

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for new in out.new_requests:
            self.prompt_len[new.request_id] = len(new.prompt_token_ids) + len(new.output_token_ids)
        computed = {c.request_id: c.num_computed_tokens for c in out.cached_requests}
        computed.update({n.request_id: n.num_computed_tokens for n in out.new_requests})
        self.last = batch_shape(out, computed, self.prompt_len)
        return self.inner.execute(out)


def measure_memory_bandwidth(nbytes: int = 1 << 28, repeats: int = 5) -> float:
    """Bytes per second of a large copy (read + write counted), the best of a few."""
    a = np.ones(nbytes // 8)
    b = np.empty_like(a)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = max(best, 2 * nbytes / (time.perf_counter() - t0))
    return best


def run_point(engine: Any, recorder: ShapeRecorder, prompt_len: int, num_seqs: int, output_len: int,
              rng: np.random.Generator) -> list[tuple[BatchShape, float]]:
    """One grid point to the end: every step's shape and wall time."""
    from tokenmill.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    for _ in range(num_seqs):
        ids = [int(t) for t in rng.integers(100, engine.vocab_size - 1, size=prompt_len)]
        engine.add_request(None, ids, params)
    steps = []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        if recorder.last is not None and recorder.last.num_seqs:
            steps.append((recorder.last, dt))
        recorder.last = None
    return steps


def collect(engine: Any, grid: tuple[tuple[int, int], ...], output_len: int, repeats: int = 3, seed: int = 0,
            progress: bool = True) -> list[tuple[BatchShape, float]]:
    """Each grid point `repeats` times; its step sequence is the same every time (random prompts, no
    cache hits), so each step keeps the fastest of its repeats: on a shared machine, the other jobs
    only ever add time."""
    recorder = ShapeRecorder(engine.core.executor)
    engine.core.executor = recorder
    rng = np.random.default_rng(seed)
    run_point(engine, recorder, 64, 2, output_len, rng)  # warm-up
    samples: list[tuple[BatchShape, float]] = []
    for point, (prompt_len, num_seqs) in enumerate(grid, 1):
        runs = [run_point(engine, recorder, prompt_len, num_seqs, output_len, rng) for _ in range(repeats)]
        for steps in zip(*runs):
            if len({shape for shape, _ in steps}) == 1:
                samples.append((steps[0][0], min(dt for _, dt in steps)))
        if progress:
            print(f"  grid {point}/{len(grid)}: prompt {prompt_len} x {num_seqs} requests, {repeats} runs", flush=True)
    return samples


@dataclass
class FitResult:
    coeff: PerfCoefficients
    median_abs_rel_err: float
    p90_abs_rel_err: float


FITTED = ("linear_flops_per_s", "attention_flops_per_s", "step_overhead_s", "per_seq_s", "per_token_s",
          "per_kv_token_s", "mem_bytes_per_s")


def fit(shape: ModelShape, samples: list[tuple[BatchShape, float]], mem_bytes_per_s: float,
        weight_dtype: str, kv_dtype: str) -> FitResult:
    from scipy.optimize import least_squares

    y = np.array([t for _, t in samples])

    def coeff(logp: np.ndarray) -> PerfCoefficients:
        return PerfCoefficients(**dict(zip(FITTED, np.exp(logp))))

    def residuals(logp: np.ndarray) -> np.ndarray:
        m = PerfModel(shape, coeff(logp), weight_dtype, kv_dtype)
        return np.array([m.step_time(b) for b, _ in samples]) / y - 1.0

    # the max() terms make the surface non-convex: start from a few GEMM/attention rates, keep the best
    # memory bandwidth starts from the measured copy's (a copy reads and writes; a step mostly reads)
    starts = [np.log([f_lin, f_attn, float(np.min(y)) / 2, 1e-4, 1e-6, 1e-7, mem_bytes_per_s])
              for f_lin in (20e9, 60e9, 200e9) for f_attn in (5e9, 20e9, 80e9)]
    # bandwidth within a factor 2 of the copy's (else it trades off freely against the fixed overhead)
    lo = np.full(len(FITTED), -np.inf)
    hi = np.full(len(FITTED), np.inf)
    lo[-1], hi[-1] = np.log(mem_bytes_per_s / 2), np.log(mem_bytes_per_s * 2)
    sol = min((least_squares(residuals, x0, bounds=(lo, hi)) for x0 in starts), key=lambda r: r.cost)
    err = np.abs(residuals(sol.x))
    return FitResult(coeff(sol.x), float(np.median(err)), float(np.percentile(err, 90)))


def run_profile(args: Any) -> dict[str, Any]:
    from tokenmill.engine.arg_utils import engine_config
    from tokenmill.engine.engine import LLMEngine

    engine = LLMEngine(engine_config(args))
    cfg = engine.config
    shape = ModelShape.from_folder(cfg.model.path)
    weight_dtype = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}[cfg.model.dtype]
    kv_dtype = weight_dtype if cfg.cache.kv_cache_dtype == "auto" else cfg.cache.kv_cache_dtype
    print(f"profiling {cfg.model.served_name} ({cfg.model.dtype}, {cfg.device.num_threads} threads) over "
          f"{len(DEFAULT_GRID)} batch shapes", flush=True)
    bandwidth = measure_memory_bandwidth()
    samples = collect(engine, DEFAULT_GRID, args.output_len, args.repeats)
    result = fit(shape, samples, bandwidth, weight_dtype, kv_dtype)
    return profile_record(args, engine, shape, weight_dtype, kv_dtype, bandwidth, samples, result)


def profile_record(args: Any, engine: Any, shape: ModelShape, weight_dtype: str, kv_dtype: str,
                   bandwidth: float, samples: list[tuple[BatchShape, float]], result: FitResult) -> dict[str, Any]:
    from tokenmill.cpu import cpu_model, isa_flags

    cfg = engine.config
    return {
        "kind": "tokenmill sim profile",
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpu_flags": isa_flags(),
        "model": cfg.model.served_name,
        "model_shape": asdict(shape),
        "dtype": cfg.model.dtype,
        "weight_dtype": weight_dtype,
        "kv_dtype": kv_dtype,
        "num_threads": cfg.device.num_threads,
        "attention_backend": cfg.device.attention_backend,
        "num_kv_blocks": cfg.cache.num_blocks,
        "block_size": cfg.cache.block_size,
        "max_num_batched_tokens": cfg.scheduler.max_num_batched_tokens,
        "measured_memory_bytes_per_s": bandwidth,
        "coefficients": asdict(result.coeff),
        "load_average": list(os.getloadavg()),
        "repeats": args.repeats,
        "fit": {"num_steps": len(samples), "median_abs_rel_err": result.median_abs_rel_err,
                "p90_abs_rel_err": result.p90_abs_rel_err},
        "samples": [[b.num_prefill_tokens, b.num_decode_tokens, b.num_seqs, b.attention_pairs, b.kv_tokens_read,
                     round(t, 6)] for b, t in samples],
    }


def refit(profile: dict[str, Any]) -> dict[str, Any]:
    """The profile's recorded steps fitted again (after a change to the model or the fit)."""
    shape = ModelShape(**profile["model_shape"])
    samples = [(BatchShape(p, d, n, a, k), t) for p, d, n, a, k, t in profile["samples"]]
    result = fit(shape, samples, profile["measured_memory_bytes_per_s"], profile["weight_dtype"], profile["kv_dtype"])
    return {**profile, "coefficients": asdict(result.coeff),
            "fit": {"num_steps": len(samples), "median_abs_rel_err": result.median_abs_rel_err,
                    "p90_abs_rel_err": result.p90_abs_rel_err}}
