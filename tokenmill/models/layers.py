"""Building blocks shared by the Llama family: token embedding, RMSNorm, rotary embedding, SwiGLU MLP."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tokenmill.kernels import cpu_ops
from tokenmill.models.linear import Linear
from tokenmill.quant import QuantConfig


def _fused(x: torch.Tensor) -> bool:
    """Our fused C++ ops apply (float32 activations, kernels built); else the PyTorch ops below."""
    return x.dtype == torch.float32 and x.dim() == 2 and cpu_ops.load()


class VocabEmbedding(nn.Embedding):
    """nn.Embedding without the random initialisation: the checkpoint fills the table. On the meta
    device (loader.build_model) torch's normal_ runs through torch._refs, whose first use imports
    torch._dynamo: seconds of every engine start (docs/BENCHMARKS.md, "Start-up time") for numbers
    that are overwritten anyway."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x); or, given the residual stream, (norm(residual + x), residual + x). The fused path
        updates x and residual in place (both belong to the caller's layer)."""
        if residual is None:
            if _fused(x):
                return torch.ops.tokenmill.rms_norm(x, self.weight, self.eps)
            return self._norm(x)
        if _fused(x) and residual.dtype == torch.float32:
            torch.ops.tokenmill.fused_add_rms_norm(x, residual, self.weight, self.eps)
            return x, residual
        residual = residual + x
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # float32 statistics as in the HF reference, cast back before the weight multiply
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_inv_freq(inv_freq: torch.Tensor, head_dim: int, theta: float, scaling: dict) -> tuple[torch.Tensor, float]:
    """YaRN (as transformers computes it): low frequencies interpolated by `factor`, high ones kept,
    a linear ramp between; cos/sin scaled by the attention factor."""
    factor = scaling["factor"]
    old_len = scaling["original_max_position_embeddings"]
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = (yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all) if mscale and mscale_all
                     else yarn_mscale(factor))

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(scaling.get("beta_fast") or 32), correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp
    return inv_freq / factor * (1 - extrapolate) + inv_freq * extrapolate, float(attention)


class RotaryEmbedding(nn.Module):
    """HF (rotate-half) layout. cos/sin tables for every position are built once."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        attention_factor = 1.0
        if rope_type == "llama3":
            inv_freq = _llama3_inv_freq(inv_freq, scaling)
        elif rope_type == "linear":
            inv_freq = inv_freq / scaling["factor"]
        elif rope_type == "yarn":
            inv_freq, attention_factor = _yarn_inv_freq(inv_freq, head_dim, theta, scaling)
        elif rope_type not in ("default", None):
            raise ValueError(f"unsupported rope_scaling type {rope_type!r}; supported: default, linear, llama3, yarn")
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32, device="cpu"), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        # plain attributes, not buffers: built for real even when the model is created on the meta
        # device, and left alone by to_empty() and dtype casts
        self.cos, self.sin = emb.cos() * attention_factor, emb.sin() * attention_factor

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Gathered once per step and shared by every layer: [T, D] each."""
        return self.cos[positions].to(dtype), self.sin[positions].to(dtype)

    @staticmethod
    def apply(q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]):
        """q [T, H, D], k [T, Hkv, D]. The fused path rotates them in place (views of the qkv output)."""
        cos, sin = cos_sin
        if q.dtype == torch.float32 and cpu_ops.load():
            torch.ops.tokenmill.rotary_(q, cos, sin)
            torch.ops.tokenmill.rotary_(k, cos, sin)
            return q, k
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class SwiGLU(nn.Module):
    """gate and up projections fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int, quant: QuantConfig, prefix: str) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden, [intermediate, intermediate],
                                   quant_method=quant.get_linear_method(f"{prefix}.gate_up_proj"),
                                   prefix=f"{prefix}.gate_up_proj")
        self.down_proj = Linear(intermediate, hidden, quant_method=quant.get_linear_method(f"{prefix}.down_proj"),
                                prefix=f"{prefix}.down_proj")
        self.intermediate = intermediate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self.gate_up_proj.quant_method.apply_swiglu(self.gate_up_proj, x, self.down_proj)
        if fused is not None:
            return self.down_proj(fused)
        gate_up = self.gate_up_proj(x)
        if _fused(gate_up):
            return self.down_proj(torch.ops.tokenmill.silu_and_mul(gate_up))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)
