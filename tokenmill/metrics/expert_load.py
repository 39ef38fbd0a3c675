"""Expert load of MoE models: tokens routed to each expert of each MoE layer (torch-free).

The runner counts them every step (each token counts once for each of its top-k experts) as
{model layer index: [tokens per expert]}; `ExpertLoad` accumulates the counts, and its imbalance
per layer — the busiest expert's tokens over the mean — is what an operator looks at before
choosing expert parallelism or replication: with experts split over N devices, the step waits for
the busiest one, so an imbalance of 2 means half the expert capacity idles."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ExpertLoad:
    tokens: dict[int, list[int]] = field(default_factory=dict)  # layer -> tokens routed to each expert

    def add(self, step: dict[int, list[int]]) -> None:
        for layer, row in step.items():
            acc = self.tokens.setdefault(layer, [0] * len(row))
            for e, n in enumerate(row):
                acc[e] += n

    @staticmethod
    def imbalance_of(row: list[int]) -> float:
        """max / mean tokens per expert (1.0 = perfectly even; NaN before any token)."""
        total = sum(row)
        return max(row) * len(row) / total if total else float("nan")

    def imbalance(self) -> dict[int, float]:
        return {layer: self.imbalance_of(row) for layer, row in self.tokens.items()}

    def summary(self) -> dict:
        """For benchmark JSON records."""
        imb = list(self.imbalance().values())
        return {"layers": [{"layer": layer, "tokens_per_expert": row, "imbalance_max_over_mean": self.imbalance_of(row)}
                           for layer, row in self.tokens.items()],
                "imbalance_max_over_mean_worst_layer": max(imb) if imb else None,
                "imbalance_max_over_mean_mean": sum(imb) / len(imb) if imb else None}
