"""Per-role performance profiles for the elastic P:D planner (torch-free, plain data).

- `PrefillCurve`: TTFT of one prompt alone against its length (ISL), so one prefill engine's
  capacity in prompt tokens/s at a length is ISL / TTFT(ISL), derated by queueing so that the
  mean wait still fits a TTFT target.
- `DecodeCurve`: ITL (one decode step) against the batch (requests decoding together) and their
  context; one decode engine's capacity in output tokens/s under an ITL target is batch / ITL at
  the largest batch whose ITL meets the target and whose KV fits the engine's cache.

Where the numbers come from: `role_profile_from_sim` evaluates the simulator's fitted performance
model (`tokenmill sim profile` measures the real engine on this machine over a grid of batch
shapes and fits it; `sim/profiles/cpu_smollm2_135m.json` is shipped) at each grid point, prefill
in `max_num_batched_tokens` chunks plus the measured serving path's admission time; or a JSON file
of the two tables (`to_json`), e.g. written by hand or from another measurement.

    python -m tokenmill.disagg.role_profile [--sim-profile P.json] [--out role_profile.json]
"""
from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ISL_GRID = (16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
BATCH_GRID = (1, 2, 4, 8, 16, 32, 64, 128)
CONTEXT_GRID = (64, 128, 256, 512, 1024, 2048, 4096)


def interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys); the first value below xs[0], the last segment's line above."""
    if x <= xs[0]:
        return ys[0]
    i = min(bisect.bisect_right(xs, x), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _check_grid(name: str, xs: Sequence[float]) -> None:
    if len(xs) < 2 or any(b <= a for a, b in zip(xs, xs[1:])) or xs[0] <= 0:
        raise ValueError(f"{name} must be at least 2 positive, strictly increasing values, got {list(xs)}")


@dataclass(frozen=True)
class PrefillCurve:
    isl: tuple[float, ...]
    ttft_s: tuple[float, ...]

    def __post_init__(self) -> None:
        _check_grid("prefill.isl", self.isl)
        if len(self.ttft_s) != len(self.isl) or not all(t > 0 for t in self.ttft_s):
            raise ValueError("prefill.ttft_s needs one positive value per prefill.isl point")

    def ttft(self, isl: float) -> float:
        return max(interp(self.isl, self.ttft_s, isl), self.ttft_s[0] * 1e-3)

    def capacity(self, isl: float, ttft_target_s: float) -> float:
        """Prompt tokens/s one engine prefills at this length while the mean TTFT stays under the
        target: prompts served one after another (service time S = TTFT(isl)) at utilisation rho,
        with an M/D/1 queue's mean wait rho*S / (2(1-rho)) <= target - S, so
        rho <= 2(T-S) / (2T-S); a target at or under S itself leaves rho at a 10% floor."""
        isl = max(isl, 1.0)
        s = self.ttft(isl)
        rho = 2 * (ttft_target_s - s) / (2 * ttft_target_s - s) if ttft_target_s > s else 0.0
        return max(rho, 0.1) * isl / s


@dataclass(frozen=True)
class DecodeCurve:
    context: tuple[float, ...]
    batch: tuple[float, ...]
    itl_s: tuple[tuple[float, ...], ...]  # [context][batch]
    kv_tokens: float  # KV cache capacity of one engine, tokens (bounds the batch at a context)
    max_batch: float = 256  # the engine's max_num_seqs

    def __post_init__(self) -> None:
        _check_grid("decode.context", self.context)
        _check_grid("decode.batch", self.batch)
        if len(self.itl_s) != len(self.context) or any(len(r) != len(self.batch) for r in self.itl_s):
            raise ValueError("decode.itl_s needs one row per context point and one value per batch point")
        if not all(t > 0 for row in self.itl_s for t in row) or self.kv_tokens <= 0 or self.max_batch < 1:
            raise ValueError("decode.itl_s values, kv_tokens and max_batch must be positive")

    def itl(self, batch: float, context: float) -> float:
        per_context = [interp(self.batch, row, max(batch, 1.0)) for row in self.itl_s]
        return interp(self.context, per_context, context)

    def capacity(self, context: float, itl_target_s: float) -> float:
        """Output tokens/s one engine decodes at this context: the largest batch whose ITL meets
        the target (bisection: ITL grows with the batch) and whose KV fits, times 1/ITL."""
        context = max(context, 1.0)
        hi = max(1.0, min(self.max_batch, self.kv_tokens / context))
        if self.itl(hi, context) <= itl_target_s:
            b = hi
        elif self.itl(1.0, context) > itl_target_s:
            b = 1.0  # the target is out of reach: one stream's rate
        else:
            lo = 1.0
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if self.itl(mid, context) <= itl_target_s else (lo, mid)
            b = lo
        return b / self.itl(b, context)


@dataclass(frozen=True)
class RoleProfile:
    prefill: PrefillCurve
    decode: DecodeCurve
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"kind": "tokenmill role profile", "source": self.source,
                "prefill": {"isl": list(self.prefill.isl), "ttft_s": list(self.prefill.ttft_s)},
                "decode": {"context": list(self.decode.context), "batch": list(self.decode.batch),
                           "itl_s": [list(r) for r in self.decode.itl_s], "kv_tokens": self.decode.kv_tokens,
                           "max_batch": self.decode.max_batch}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RoleProfile:
        try:
            p, dec = d["prefill"], d["decode"]
            return cls(PrefillCurve(tuple(p["isl"]), tuple(p["ttft_s"])),
                       DecodeCurve(tuple(dec["context"]), tuple(dec["batch"]), tuple(tuple(r) for r in dec["itl_s"]),
                                   float(dec["kv_tokens"]), float(dec.get("max_batch", 256))),
                       str(d.get("source", "")))
        except (KeyError, TypeError) as e:
            raise ValueError(f"a role profile needs prefill.isl/ttft_s and decode.context/batch/itl_s/kv_tokens "
                             f"({e!r})") from e


def role_profile_from_sim(profile: dict[str, Any], kv_tokens: float | None = None, max_batch: float = 256,
                          source: str = "") -> RoleProfile:
    """Both curves from a `tokenmill sim profile` record (its fitted step-time model)."""
    from tokenmill.sim.hardware import profile_perf_model
    kv = kv_tokens or float(profile["num_kv_blocks"]) * float(profile.get("block_size", 16))
    return role_profile_from_perf(profile_perf_model(profile), int(profile.get("max_num_batched_tokens", 1024)), kv,
                                  max_batch, source or f"sim profile of {profile.get('model')} on "
                                  f"{profile.get('cpu')} ({profile.get('date')})")


def role_profile_from_perf(perf: Any, chunk: int, kv_tokens: float, max_batch: float = 256,
                           source: str = "") -> RoleProfile:
    """Both curves from a simulator `PerfModel` (measured here, or a datasheet's): prefill in
    `chunk`-token steps plus the serving path's admission time; one decode step per ITL."""
    from tokenmill.sim.perf_model import BatchShape

    def ttft(isl: int) -> float:
        t = perf.serving.admission_s(isl) if perf.serving is not None else 0.0
        for c0 in range(0, isl, chunk):
            n = min(chunk, isl - c0)
            t += perf.step_time(BatchShape(num_prefill_tokens=n, num_seqs=1, attention_pairs=n * c0 + n * (n + 1) // 2,
                                           kv_tokens_read=c0 + n, num_output_seqs=int(c0 + n >= isl)))
        return t

    def itl(b: int, c: int) -> float:
        return perf.step_time(BatchShape(num_decode_tokens=b, num_seqs=b, attention_pairs=b * (c + 1),
                                         kv_tokens_read=b * (c + 1), num_output_seqs=b))

    return RoleProfile(PrefillCurve(ISL_GRID, tuple(ttft(i) for i in ISL_GRID)),
                       DecodeCurve(CONTEXT_GRID, BATCH_GRID, tuple(tuple(itl(b, c) for b in BATCH_GRID)
                                                                    for c in CONTEXT_GRID), kv_tokens, max_batch),
                       source)


def load_role_profile(path: Path | str | None = None, kv_tokens: float | None = None) -> RoleProfile:
    """A role profile file, or a `tokenmill sim profile` file (derived here); None: the shipped CPU one."""
    if path is None:
        from tokenmill.sim.hardware import DEFAULT_CPU_PROFILE
        path = DEFAULT_CPU_PROFILE
    d = json.loads(Path(str(path)).read_text())
    if d.get("kind") == "tokenmill sim profile":
        return role_profile_from_sim(d, kv_tokens, source=f"{path}")
    return RoleProfile.from_json(d)


def describe(profile: RoleProfile, ttft_target_s: float, itl_target_s: float) -> str:
    """A short table: prefill capacity by ISL, decode capacity by context, under the targets."""
    lines = [f"role profile: {profile.source}", "  ISL   TTFT ms   prefill tok/s/engine (TTFT <= "
             f"{ttft_target_s * 1e3:.0f} ms)"]
    for isl in (128, 512, 1536, 4096):
        lines.append(f"  {isl:>4}  {profile.prefill.ttft(isl) * 1e3:8.1f}  {profile.prefill.capacity(isl, ttft_target_s):10.0f}")
    lines.append(f"  context  ITL@1 ms  decode tok/s/engine (ITL <= {itl_target_s * 1e3:.0f} ms)")
    for c in (256, 1024, 4096):
        lines.append(f"  {c:>7}  {profile.decode.itl(1, c) * 1e3:7.1f}  {profile.decode.capacity(c, itl_target_s):10.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tokenmill.disagg.role_profile", description=__doc__.split("\n")[0])
    ap.add_argument("--sim-profile", type=Path, default=None, help="a `tokenmill sim profile` JSON (default: shipped)")
    ap.add_argument("--kv-tokens", type=float, default=None, help="one engine's KV capacity in tokens (default: the "
                                                                  "profiled engine's)")
    ap.add_argument("--ttft-target-ms", type=float, default=2000.0)
    ap.add_argument("--itl-target-ms", type=float, default=100.0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    profile = load_role_profile(args.sim_profile, args.kv_tokens)
    print(describe(profile, args.ttft_target_ms / 1e3, args.itl_target_ms / 1e3))
    if args.out:
        args.out.write_text(json.dumps(profile.to_json(), indent=1))
    return 0 if all(math.isfinite(t) for t in profile.prefill.ttft_s) else 1


if __name__ == "__main__":
    sys.exit(main())
