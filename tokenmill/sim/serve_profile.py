"""`tokenmill sim profile --serve`: the serving path's cost beyond `LLMEngine.step()`, measured
through a live `tokenmill serve` and fitted as the `ServingOverhead` terms of the performance model.

What the server adds (tokenmill/engine/async_engine.py, server/): the engine loop thread runs the
steps; after each it hands the outputs to the asyncio thread (`call_soon_threadsafe`), which turns
each into a text delta, a JSON chunk and an SSE write, while the benchmark client parses it. Both
threads share the GIL and, on a small machine, the cores: that work lengthens the engine's steps
(`stream_per_step_s` + `stream_per_seq_s` per request given a token). Before a request reaches the
scheduler, the server parses its HTTP body and tokenizes its prompt (`admit_s` +
`admit_per_prompt_token_s` per prompt token).

The calibration workload is its own (fixed shapes and seed, random words, the completions endpoint;
none of `sim validate`'s workloads): admission probes (one request at a time, prompts of several
lengths, 2 output tokens) and streaming probes (S requests sent together, short prompts, long
outputs, for several S). Every probe is also simulated with the engine-only model at the moment it
was sent; the residuals are linear in the four terms:

    TPOT residual of a streaming probe of S requests = stream_per_step + stream_per_seq·S
    TTFT residual of an admission probe of L tokens  = admit + admit_per_prompt_token·L
                                                       + stream_per_step + stream_per_seq

and a nonnegative least-squares fit finds them.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from tokenmill.server.launch import SWITCH_INTERVAL_S
from tokenmill.sim.perf_model import ServingOverhead

ADMIT_LENS = (16, 256, 1024)  # prompt tokens of the admission probes
ADMIT_REPEATS = 5
ADMIT_OUTPUT = 2
STREAM_SEQS = (1, 4, 8, 16)  # concurrent requests of the streaming probes
STREAM_REPEATS = 2
STREAM_PROMPT = 24
STREAM_OUTPUT = 48
SEED = 1_000_019  # the validation runs use seeds 0..N


@dataclass(frozen=True)
class Probe:
    kind: str  # "admit" (TTFT residual) or "stream" (TPOT residual)
    size: int  # prompt tokens (admit) or concurrent requests (stream)
    measured_s: float  # median over the probe's requests
    simulated_s: float  # the engine-only simulation of the same requests

    @property
    def residual_s(self) -> float:
        return self.measured_s - self.simulated_s


def design_row(p: Probe) -> list[float]:
    """The probe's residual as a linear combination of (admit, per prompt token, per step, per seq)."""
    if p.kind == "stream":
        return [0.0, 0.0, 1.0, float(p.size)]
    if p.kind == "admit":
        return [1.0, float(p.size), 1.0, 1.0]
    raise ValueError(f"probe kind must be 'admit' or 'stream', got {p.kind!r}")


def fit_serving(probes: list[Probe]) -> ServingOverhead:
    """Nonnegative least squares of the residuals on the four terms (each probe's equation scaled by
    its measured value, so a long TTFT and a short TPOT weigh alike in relative terms)."""
    from scipy.optimize import nnls

    if not any(p.kind == "stream" for p in probes) or not any(p.kind == "admit" for p in probes):
        raise ValueError("the serving fit needs both admission and streaming probes")
    a = np.array([design_row(p) for p in probes])
    y = np.array([p.residual_s for p in probes])
    w = 1.0 / np.array([max(p.measured_s, 1e-6) for p in probes])
    terms, _ = nnls(a * w[:, None], y * w)
    return ServingOverhead(*map(float, terms))


# -- measuring through a live server -------------------------------------------------------------
@dataclass
class _Sent:
    kind: str
    size: int
    prompt: str
    output_len: int
    offset_s: float = 0.0  # send time from the calibration start
    ttft_s: float | None = None
    tpot_s: float | None = None


async def _send(client: Any, cfg: Any, sent: _Sent, t0: float) -> None:
    from tokenmill.bench.client import RequestResult, stream_request
    from tokenmill.bench.metrics import request_tpot
    from tokenmill.bench.workloads import BenchRequest

    req = BenchRequest(sent.prompt, 0, sent.output_len)
    res = RequestResult(0, 0, sent.output_len, 0.0)
    await stream_request(client, cfg, req, res, t0)
    if not res.success:
        raise RuntimeError(f"calibration request failed: {res.error}")
    sent.offset_s, sent.ttft_s, sent.tpot_s = res.start_s, res.ttft_s, request_tpot(res)


async def _probe_server(base_url: str, model: str, builder: Any, rng: np.random.Generator) -> list[_Sent]:
    import httpx

    from tokenmill.bench.client import EndpointConfig

    cfg = EndpointConfig(base_url, model)
    sent: list[_Sent] = []
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        warm = _Sent("warm", 0, builder.text(64, rng), 4)
        await _send(client, cfg, warm, t0)
        for _ in range(ADMIT_REPEATS):
            for n in ADMIT_LENS:
                s = _Sent("admit", n, builder.text(n, rng), ADMIT_OUTPUT)
                await _send(client, cfg, s, t0)
                sent.append(s)
                await asyncio.sleep(0.2)
        for _ in range(STREAM_REPEATS):
            for n in STREAM_SEQS:
                batch = [_Sent("stream", n, builder.text(STREAM_PROMPT, rng), STREAM_OUTPUT) for _ in range(n)]
                await asyncio.gather(*(_send(client, cfg, s, t0) for s in batch))
                sent.extend(batch)
                await asyncio.sleep(0.3)
    return sent


def _simulate(sent: list[_Sent], profile: dict[str, Any], tokens: Any, num_kv_blocks: int,
              max_num_batched_tokens: int) -> list[tuple[float, float | None]]:
    """(TTFT, TPOT) of each request under the engine-only model, sent when it really was."""
    from tokenmill.sim.cluster import ClusterConfig, build_cluster
    from tokenmill.sim.hardware import profile_perf_model
    from tokenmill.sim.simulator import ClusterSimulator, SimRequest

    engine_only = {k: v for k, v in profile.items() if k != "serving"}
    cfg = ClusterConfig(num_kv_blocks=num_kv_blocks, max_num_batched_tokens=max_num_batched_tokens)
    specs, _ = build_cluster(cfg, profile_perf_model(engine_only).shape, profile=engine_only)
    sims = ClusterSimulator(specs).run([SimRequest(str(i), s.offset_s, tokens(s.prompt), s.output_len)
                                        for i, s in enumerate(sent)])
    out = []
    for r in sims:
        n = len(r.token_times)
        out.append((r.ttft, (r.e2e - r.ttft) / (n - 1) if n > 1 else None))
    return out


def probes_of(sent: list[_Sent], simulated: list[tuple[float, float | None]]) -> list[Probe]:
    """One probe per (kind, size): the median over its requests of measured and simulated values."""
    groups: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for s, (ttft, tpot) in zip(sent, simulated):
        pair = (s.ttft_s, ttft) if s.kind == "admit" else (s.tpot_s, tpot)
        if pair[0] is not None and pair[1] is not None:
            groups.setdefault((s.kind, s.size), []).append(pair)
    return [Probe(kind, size, statistics.median(m for m, _ in v), statistics.median(x for _, x in v))
            for (kind, size), v in sorted(groups.items())]


def serve_args(profile: dict[str, Any], args: Any) -> list[str]:
    """`tokenmill serve` flags matching the profiled engine (model, dtype, threads)."""
    out = ["--num-threads", str(profile["num_threads"]), "--dtype", str(profile["dtype"])]
    model = getattr(args, "model", None)
    return [*out, "--model", str(model)] if model else out


def measure_serving(profile: dict[str, Any], server_args: list[str], num_kv_blocks: int,
                    max_num_batched_tokens: int, log: Path) -> dict[str, Any]:
    """Start `tokenmill serve` with `server_args`, probe it, fit; the profile's `serving` record."""
    from tokenmill.bench.workloads import PromptBuilder, load_tokenizer
    from tokenmill.models.default_model import resolve_default_model
    from tokenmill.sim.validate import free_port, launch_server
    from tokenmill.sim.workload import TokenCounter

    tokenizer = load_tokenizer(str(resolve_default_model()))
    port = free_port()
    server = launch_server([*server_args, "--num-kv-blocks", str(num_kv_blocks), "--max-num-batched-tokens",
                            str(max_num_batched_tokens)], port, log)
    load_before = os.getloadavg()
    try:
        rng = np.random.default_rng(SEED)
        sent = asyncio.run(_probe_server(f"http://127.0.0.1:{port}", profile["model"], PromptBuilder(tokenizer), rng))
    finally:
        server.terminate()
        server.wait(timeout=60)
    simulated = _simulate(sent, profile, TokenCounter(tokenizer), num_kv_blocks, max_num_batched_tokens)
    probes = probes_of(sent, simulated)
    terms = fit_serving(probes)
    with_terms = [replace(p, simulated_s=p.simulated_s + float(np.dot(design_row(p), astuple_terms(terms))))
                  for p in probes]
    return {
        "terms": asdict(terms),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "server_args": server_args,
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "server_switch_interval_s": SWITCH_INTERVAL_S,  # what `tokenmill serve` sets (the GIL hand-off)
        "probes": [[p.kind, p.size, round(p.measured_s, 6), round(p.simulated_s, 6)] for p in probes],
        "fit_abs_rel_err": [round(abs(p.residual_s) / p.measured_s, 4) for p in with_terms],
    }


def astuple_terms(terms: ServingOverhead) -> list[float]:
    return [terms.admit_s, terms.admit_per_prompt_token_s, terms.stream_per_step_s, terms.stream_per_seq_s]

