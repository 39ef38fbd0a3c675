"""How many tokens a model-run draft (layer_skip, draft_model) should propose next: whatever
maximizes expected tokens per second, from what drafting has recently cost and earned.

With per-token acceptance a (the chance a draft is accepted given the one before it was) and k
drafts, a step emits E(k) = 1 + a + ... + a^k tokens and costs 1 + k*c target steps, c being one
draft step's time over one target step's. Unlike a lookup, a model draft costs a forward pass per
token, so when a <= c (a weak draft, e.g. an early exit the model was not trained for) k = 0 is
best: drafting stops, and only a one-token probe every `probe_every` steps keeps a up to date."""
from __future__ import annotations

import statistics
from collections import deque

MIN_GAIN = 1.05  # speculate only for an expected >= 5% more tokens/s: verification is not free
DECAY = 0.98  # acceptance memory: about the last 50 drafted positions


class DraftLength:
    def __init__(self, k_max: int, probe_every: int = 32, prior_acceptance: float = 0.7) -> None:
        self.k_max = k_max
        self.probe_every = probe_every
        self.hits, self.trials = prior_acceptance, 1.0
        self.draft_s: deque[float] = deque(maxlen=32)  # one draft step (a forward over one token each)
        self.step_s: deque[float] = deque(maxlen=32)  # one engine step without its drafting
        self.steps_off = 0

    @property
    def acceptance(self) -> float:
        return self.hits / self.trials

    def observe_verification(self, drafted: int, accepted: int) -> None:
        """A request verified `drafted` drafts and accepted the first `accepted` of them."""
        reached = min(accepted + 1, drafted)  # positions verified up to the first rejection
        keep = DECAY ** reached
        self.hits = self.hits * keep + accepted
        self.trials = self.trials * keep + reached

    def observe_times(self, step_s: float, draft_step_s: float | None) -> None:
        self.step_s.append(step_s)
        if draft_step_s is not None:
            self.draft_s.append(draft_step_s)

    def best_k(self) -> int:
        """The k for this step (a probe of 1 now and then while the best is 0)."""
        k = self._best()
        if k > 0:
            self.steps_off = 0
            return k
        self.steps_off += 1
        return 1 if self.steps_off % self.probe_every == 0 else 0

    @property
    def cost_ratio(self) -> float | None:
        """One draft step's time over one engine step's (without drafting), recent medians."""
        if not self.draft_s or not self.step_s:
            return None
        return statistics.median(self.draft_s) / statistics.median(self.step_s)

    def gains(self) -> list[float] | None:
        """Expected tokens/s relative to no drafting, for k = 0..k_max."""
        c = self.cost_ratio
        if c is None:
            return None
        a = min(self.acceptance, 0.999)
        return [(1 - a ** (k + 1)) / (1 - a) / (1 + k * c) for k in range(self.k_max + 1)]

    def _best(self) -> int:
        gains = self.gains()
        if gains is None:
            return self.k_max  # nothing measured yet: try
        best = max(range(self.k_max + 1), key=gains.__getitem__)
        return best if gains[best] >= MIN_GAIN else 0
