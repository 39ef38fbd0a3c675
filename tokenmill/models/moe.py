"""A sparse MoE MLP: router, routed experts computed in one batched pass, optional shared experts.

Experts run batched: the step's (token, expert) assignments are sorted by expert, each active expert
runs one matmul pair (gate_up, down) over its contiguous rows, and the weighted rows are added back
to their tokens with one index_add. There is no loop over tokens; the loop is over the experts that
received tokens this step. Each expert is a SwiGLU of quantizable `Linear`s (our panel GEMM).

Expert parallelism: with a process group set (`tokenmill.models.expert_parallel`), this process holds
only its share of the experts and the rows travel to their expert's owner by all-to-all.

Every layer counts the tokens routed to each of its experts (`take_load`), which the runner turns
into the expert-load metrics."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.models import expert_parallel
from tokenmill.models.layers import SwiGLU
from tokenmill.models.linear import Linear
from tokenmill.models.model_config import MoESpec
from tokenmill.models.routing import route
from tokenmill.quant import QuantConfig


class Router(nn.Module):
    """logits = x Wᵀ in float32 (as the references; DeepSeek's router weight is float32 too)."""

    def __init__(self, hidden: int, spec: MoESpec) -> None:
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.empty(spec.num_experts, hidden, dtype=torch.float32))
        # DeepSeek-V3: a per-expert bias added to the scores when choosing (load balancing)
        self.e_score_correction_bias = (nn.Parameter(torch.empty(spec.num_experts, dtype=torch.float32))
                                        if spec.correction_bias else None)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight)
        return route(logits, self.spec, self.e_score_correction_bias)


class Experts(nn.ModuleDict):
    """The routed experts this process holds, keyed by their global index (checkpoint names
    experts.{e}.* land here whether or not every expert is local)."""

    def __init__(self, hidden: int, spec: MoESpec, quant: QuantConfig, prefix: str) -> None:
        super().__init__()
        self.num_experts = spec.num_experts
        self.layer = int(prefix.split(".")[1]) if prefix.startswith("layers.") else -1  # for the load metrics
        self.local = expert_parallel.local_experts(spec.num_experts)
        self.update({str(e): SwiGLU(hidden, spec.intermediate_size, quant, f"{prefix}.{e}") for e in self.local})
        self.load = torch.zeros(spec.num_experts, dtype=torch.int64, device="cpu")  # tokens since take_load

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [T, H], weights/ids [T, k] -> sum over k of weight * expert(x), [T, H]."""
        flat = ids.reshape(-1)
        counts = torch.bincount(flat, minlength=self.num_experts)
        self.load += counts
        if expert_parallel.is_enabled():
            return expert_parallel.dispatch_combine(self, x, weights, ids, counts)
        order = torch.argsort(flat, stable=True)
        token = order // ids.shape[1]
        rows = self.run_grouped(x[token], counts.tolist())
        rows.mul_(weights.reshape(-1)[order, None].to(rows.dtype))
        return torch.zeros_like(x).index_add_(0, token, rows)

    def run_grouped(self, rows: torch.Tensor, counts: list[int], first_expert: int = 0) -> torch.Tensor:
        """rows sorted by expert (counts[i] rows for expert first_expert + i) -> each through its expert."""
        out = torch.empty_like(rows)
        start = 0
        for i, n in enumerate(counts):
            if n:
                out[start:start + n] = self[str(first_expert + i)](rows[start:start + n])
                start += n
        return out

    def take_load(self) -> torch.Tensor:
        load, self.load = self.load, torch.zeros_like(self.load)
        return load


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, spec: MoESpec, quant: QuantConfig, prefix: str) -> None:
        super().__init__()
        self.gate = Router(hidden, spec)
        self.experts = Experts(hidden, spec, quant, f"{prefix}.experts")
        self.shared_name = spec.shared_name if spec.shared_intermediate_size else None
        if self.shared_name:
            setattr(self, self.shared_name, SwiGLU(hidden, spec.shared_intermediate_size, quant,
                                                   f"{prefix}.{self.shared_name}"))
        # Qwen2-MoE: the shared expert's output is scaled by sigmoid(x · w)
        self.shared_expert_gate = (Linear(hidden, 1, quant_method=None, prefix=f"{prefix}.shared_expert_gate")
                                   if spec.shared_gate else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts(x, weights, ids)
        if self.shared_name:
            shared = getattr(self, self.shared_name)(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


def moe_layers(model: nn.Module) -> list[Experts]:
    return [m for m in model.modules() if isinstance(m, Experts)]
