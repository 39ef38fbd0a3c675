"""The profile-driven elastic P:D planner (`tokenmill cluster --planner profile`): pure functions over
plain data, after the idea of Dynamo's SLA planner, for a fixed set of N engines that move between
the prefill and decode pools. Each interval:

1. **Observe** (`IntervalLoad`, built by the router): requests that arrived, their prompt tokens
   split into those long enough to hand over (uncached suffix >= the router's threshold) and the
   rest, tokens generated (engines' counters), the TTFTs the router saw, the engines' mean ITL
   and the mean batch on the decode instances.
2. **Predict** the next interval's load (`predict`): an exponential moving average of the token
   rates and mean lengths.
3. **Correct** (`correct`): measured / expected latency, expected from the profile (the TTFTs
   against each request's own ISL; ITL at the mean batch and context), clamped. A decode engine's
   ITL target is tightened by its factor (as Dynamo does; the profile's ITL already grows with the
   batch, so a busy decode pool does not inflate it). A prefill engine's capacity is scaled by the
   TTFT factor only downwards to 1 (`max_prefill_correction`): a TTFT above the profile's is mostly
   queueing, which the arrival rate already sizes for, and counting it as missing capacity too made
   the simulated planner overshoot (3P:1D where 2P:2D was right); faster than profiled (prefix-cache
   hits) raises the capacity.
4. **Size** (`demand`), closed form, in engines: prefill = handed-over prompt tokens/s / one
   engine's prefill capacity under the TTFT target at that ISL; decode = output tokens/s / one
   engine's decode capacity under the ITL target at context ISL + OSL/2, plus the short prompts
   the decode engines prefill themselves.
5. **Split** (`target_prefill`): with `min_prefill` 0, a prefill demand under `colocate_below`
   engines empties the prefill pool (every engine serves whole requests: a dedicated prefill engine
   would mostly idle and short prompts gain nothing from a hand-over); it comes back over
   `colocate_above`. Otherwise, if ceil(prefill) + ceil(decode) engines fit in N, move to the
   nearest split that fits (the current one counts as fitting with a `margin` of slack: a Schmitt
   trigger against noise), and within the splits that fit give the spare engines in proportion to
   the demands; when they do not fit (overload), split N in proportion to the demands. A
   proportional target moves only when it is more than half an engine plus `margin` away.
6. **Hysteresis** (`ProfilePlanner.step`): one engine per decision, only after `patience`
   consecutive intervals asking for the same direction, never within `cooldown` intervals of the
   last move; an idle interval asks for nothing.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokenmill.disagg.planner import Decision
from tokenmill.disagg.policy import InstanceState
from tokenmill.disagg.role_profile import RoleProfile


@dataclass(frozen=True)
class SLAPlannerConfig:
    interval_s: float = 5.0
    ttft_target_s: float = 2.0
    itl_target_s: float = 0.1
    min_prefill: int = 0  # 0: the prefill pool may empty (colocated: every engine prefills its own requests)
    colocate_below: float = 0.3  # prefill demand (engines) under which the prefill pool empties ...
    colocate_above: float = 0.6  # ... and over which it is started again
    smoothing: float = 0.5  # weight of the newest interval in the load prediction (EMA)
    min_correction: float = 0.25
    max_correction: float = 4.0
    max_prefill_correction: float = 1.0  # the TTFT factor applied to prefill capacity at most (see 3.)
    margin: float = 0.25  # slack (engines) before leaving a split that fits, or the proportional one
    patience: int = 3
    cooldown: int = 2

    def __post_init__(self) -> None:
        checks = {"interval_s": self.interval_s > 0, "ttft_target_s": self.ttft_target_s > 0,
                  "itl_target_s": self.itl_target_s > 0, "min_prefill": self.min_prefill >= 0,
                  "colocate_below/colocate_above": 0 <= self.colocate_below <= self.colocate_above,
                  "smoothing": 0 < self.smoothing <= 1,
                  "min_correction/max_correction": 0 < self.min_correction <= 1 <= self.max_correction,
                  "max_prefill_correction": self.min_correction <= self.max_prefill_correction,
                  "margin": 0 <= self.margin < 0.5, "patience": self.patience >= 1, "cooldown": self.cooldown >= 0}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid planner setting(s) {', '.join(bad)}: need interval/targets > 0, min_prefill "
                             ">= 0, 0 <= colocate_below <= colocate_above, 0 < smoothing <= 1, min_correction <= 1 "
                             "<= max_correction, 0 <= margin < 0.5, patience >= 1, cooldown >= 0")


@dataclass(frozen=True)
class IntervalLoad:
    """What the router saw over one planner interval."""
    interval_s: float
    num_requests: int = 0
    num_remote_requests: int = 0  # long enough to hand over
    remote_prompt_tokens: int = 0
    local_prompt_tokens: int = 0
    output_tokens: float = 0.0
    ttft_samples: tuple[tuple[int, float], ...] = ()  # (prompt tokens, TTFT s) of the streams that began
    itl_s: float | None = None
    decode_batch: float = 1.0  # mean requests running per decode instance

    @property
    def idle(self) -> bool:
        return self.num_requests == 0 and self.output_tokens == 0


@dataclass(frozen=True)
class Prediction:
    remote_tok_s: float = 0.0
    local_tok_s: float = 0.0
    output_tok_s: float = 0.0
    remote_isl: float = 0.0
    local_isl: float = 0.0
    osl: float = 0.0

    @property
    def isl(self) -> float:
        """Mean prompt length over all requests (rates weighted)."""
        n = self._requests_per_s
        return (self.remote_tok_s + self.local_tok_s) / n if n else 0.0

    @property
    def _requests_per_s(self) -> float:
        return (self.remote_tok_s / self.remote_isl if self.remote_isl else 0.0) + \
               (self.local_tok_s / self.local_isl if self.local_isl else 0.0)


def _ema(old: float, new: float, w: float) -> float:
    return w * new + (1 - w) * old


def predict(prev: Prediction | None, load: IntervalLoad, smoothing: float) -> Prediction:
    """The next interval's load: rates and mean lengths smoothed over intervals (lengths only move
    when the interval had such requests)."""
    t = load.interval_s
    n_local = load.num_requests - load.num_remote_requests
    now = Prediction(load.remote_prompt_tokens / t, load.local_prompt_tokens / t, load.output_tokens / t,
                     load.remote_prompt_tokens / load.num_remote_requests if load.num_remote_requests else 0.0,
                     load.local_prompt_tokens / n_local if n_local else 0.0,
                     load.output_tokens / load.num_requests if load.num_requests else 0.0)
    if prev is None:
        return now
    w = smoothing
    return Prediction(_ema(prev.remote_tok_s, now.remote_tok_s, w), _ema(prev.local_tok_s, now.local_tok_s, w),
                      _ema(prev.output_tok_s, now.output_tok_s, w),
                      _ema(prev.remote_isl, now.remote_isl, w) if now.remote_isl and prev.remote_isl else
                      now.remote_isl or prev.remote_isl,
                      _ema(prev.local_isl, now.local_isl, w) if now.local_isl and prev.local_isl else
                      now.local_isl or prev.local_isl,
                      _ema(prev.osl, now.osl, w) if now.osl and prev.osl else now.osl or prev.osl)


@dataclass(frozen=True)
class Corrections:
    prefill: float = 1.0  # measured TTFT / profiled TTFT
    decode: float = 1.0  # measured ITL / profiled ITL


def correct(prev: Corrections, load: IntervalLoad, profile: RoleProfile, cfg: SLAPlannerConfig) -> Corrections:
    """Measured / expected latency this interval (the previous factor where there was no sample)."""
    def clamp(x: float) -> float:
        return min(cfg.max_correction, max(cfg.min_correction, x))
    p, d = prev.prefill, prev.decode
    n = load.num_requests
    isl = (load.remote_prompt_tokens + load.local_prompt_tokens) / n if n else 0.0
    if load.ttft_samples:
        expected = sum(profile.prefill.ttft(n) for n, _ in load.ttft_samples)
        p = clamp(sum(t for _, t in load.ttft_samples) / expected)
    if load.itl_s is not None:
        osl = load.output_tokens / n if n else 0.0
        d = clamp(load.itl_s / profile.decode.itl(load.decode_batch, isl + osl / 2))
    return Corrections(p, d)


@dataclass(frozen=True)
class Demand:
    prefill: float  # engines the handed-over prefills need
    decode: float  # engines the decodes (and the short prompts they prefill) need
    prefill_capacity: float  # prompt tokens/s per prefill engine (corrected)
    decode_capacity: float  # output tokens/s per decode engine (corrected)


def demand(pred: Prediction, corr: Corrections, profile: RoleProfile, cfg: SLAPlannerConfig) -> Demand:
    def prefill_cap(isl: float) -> float:
        return profile.prefill.capacity(isl or 1.0, cfg.ttft_target_s) / min(corr.prefill, cfg.max_prefill_correction)
    cap_p = prefill_cap(pred.remote_isl)
    cap_d = profile.decode.capacity(pred.isl + pred.osl / 2, cfg.itl_target_s / corr.decode)
    local = pred.local_tok_s / prefill_cap(pred.local_isl) if pred.local_tok_s else 0.0
    return Demand(pred.remote_tok_s / cap_p, pred.output_tok_s / cap_d + local, cap_p, cap_d)


def target_prefill(current: int, n: int, dem: Demand, cfg: SLAPlannerConfig) -> tuple[int, str]:
    """The prefill pool size the demands ask for, out of n engines, and why."""
    if cfg.min_prefill == 0 and (dem.prefill < cfg.colocate_below or (current == 0 and dem.prefill < cfg.colocate_above)):
        return 0, f"prefill demand {dem.prefill:.2f} engines too small for a pool of its own: colocate"
    lo, hi = max(1, cfg.min_prefill), n - 1
    if hi < lo:
        return current, f"{n} engines cannot hold {lo} prefill and 1 decode"
    fits_now = current >= lo and dem.prefill <= current + cfg.margin and dem.decode <= n - current + cfg.margin
    need_p, need_d = max(math.ceil(dem.prefill), 1), max(math.ceil(dem.decode), 1)
    total = dem.prefill + dem.decode
    ideal = n * dem.prefill / total if total > 0 else float(current)
    if need_p + need_d > n:
        if fits_now:
            return current, f"{current}P+{n - current}D still fits"
        target = current if current >= lo and abs(ideal - current) <= 0.5 + cfg.margin else round(ideal)
        return min(max(target, lo), hi), f"needs {need_p}P+{need_d}D > {n} engines: proportional split {ideal:.2f}P"
    rlo, rhi = max(lo, need_p), min(hi, n - need_d)  # the splits that fit
    if fits_now:
        rlo, rhi = min(rlo, current), max(rhi, current)
    target = min(max(current, rlo), rhi)
    why = f"needs {need_p}P+{need_d}D of {n}"
    if abs(ideal - target) > 0.5 + cfg.margin:  # spare engines follow the demands, past a dead band
        target = min(max(round(ideal), rlo), rhi)
        why += f", spare engines by demand {ideal:.2f}P"
    return target, why


@dataclass
class ProfilePlanner:
    """The profile-driven planner's state across intervals; `step` once per interval."""
    cfg: SLAPlannerConfig
    profile: RoleProfile
    prediction: Prediction | None = None
    corrections: Corrections = field(default_factory=Corrections)
    _streak_move: int = 0
    _streak: int = 0
    _since_move: int = 10**9

    def step(self, prefills: Sequence[InstanceState], decodes: Sequence[InstanceState], load: IntervalLoad) -> Decision:
        num_prefill, num_decode = len(prefills), len(decodes)
        self._since_move += 1
        if load.idle:
            self._streak_move, self._streak = 0, 0
            return Decision(0, "idle interval", 0.0, 0.0)
        self.prediction = predict(self.prediction, load, self.cfg.smoothing)
        self.corrections = correct(self.corrections, load, self.profile, self.cfg)
        dem = demand(self.prediction, self.corrections, self.profile, self.cfg)
        target, why = target_prefill(num_prefill, num_prefill + num_decode, dem, self.cfg)
        want = (target > num_prefill) - (target < num_prefill)
        pr = self.prediction
        figures = (f"demand {dem.prefill:.2f}P {dem.decode:.2f}D engines; predicted {pr.remote_tok_s:.0f} handed-over "
                   f"+ {pr.local_tok_s:.0f} local prompt tok/s, {pr.output_tok_s:.0f} output tok/s; correction "
                   f"TTFT x{self.corrections.prefill:.2f} ITL x{self.corrections.decode:.2f}")
        if want == 0 or want != self._streak_move:
            self._streak_move, self._streak = want, (1 if want else 0)
        else:
            self._streak += 1
        reason = f"{why} ({figures})"
        if want and self._streak >= self.cfg.patience and self._since_move > self.cfg.cooldown:
            self._streak_move, self._streak, self._since_move = 0, 0, 0
            return Decision(want, f"target {target}P: {reason}", dem.prefill, dem.decode)
        if want:
            reason = f"waiting ({self._streak}/{self.cfg.patience}, cooldown {self.cfg.cooldown}): target {target}P: {reason}"
        return Decision(0, reason, dem.prefill, dem.decode)
