"""CausalLM: what the runner and the loader need of a model, as hooks a model class overrides.

- `config_from_hf(hf_config)`: the architecture facts from config.json (ModelConfig).
- `kv_cache_spec(cfg, kv_cache_dtype, dtype, block_size)` and `num_kv_cache_layers(cfg)`: the KV
  storage one layer needs per block and how many layers have one; bytes per token, block counts,
  admission and prefix caching follow from them.
- `stacked_params`: checkpoint module names that land in one of our fused modules, with the shard
  index (q/k/v -> qkv_proj, gate/up -> gate_up_proj); `checkpoint_prefix` is stripped from names;
  names containing one of `ignored_weights` are skipped.
- `load_weights(weights)`: (checkpoint name, tensor) pairs into the parameters, each through its
  module's weight loader (`Linear.load_weight`, so a quantized format decides how it is stored).
- `tie_weights()`: shared parameters (tied embeddings), re-tied after materializing.
- `forward(input_ids, positions, kv_caches, backend, meta)` -> hidden states, `compute_logits`
  (and optionally `greedy_tokens`: the logits' argmax without writing them).
  `forward` runs one decoder layer per entry of `kv_caches`, in order, then the final norm: a
  shorter list runs only the first layers (`forward_first_layers`, the self-speculative draft).
- `allocate_kv_caches(...)`: the per-layer KV tensors for a number of blocks.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from tokenmill.attention.backend import AttentionBackend
from tokenmill.attention.kv_cache import KVCacheSpec, make_kv_cache_spec
from tokenmill.models.linear import Linear
from tokenmill.models.model_config import ModelConfig


class CausalLM(nn.Module):
    stacked_params: ClassVar[dict[str, tuple[str, int]]] = {}
    checkpoint_prefix: ClassVar[str] = "model."
    ignored_weights: ClassVar[tuple[str, ...]] = ("rotary_emb.",)

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg

    def greedy_tokens(self, hidden: torch.Tensor, vocab_size: int) -> torch.Tensor | None:
        """The argmax token of each row's logits without computing them, where the model can (the
        runner's path for plain greedy rows); None: use compute_logits."""
        return None

    # -- hooks: configuration and KV storage ---------------------------------------------------
    @classmethod
    def config_from_hf(cls, hf_config: dict[str, Any]) -> ModelConfig:
        return ModelConfig.from_hf(hf_config)

    @classmethod
    def kv_cache_spec(cls, cfg: ModelConfig, kv_cache_dtype: str, dtype: torch.dtype, block_size: int) -> KVCacheSpec:
        """Per-layer storage of one block (num_blocks=1): K and V of every KV head."""
        return make_kv_cache_spec(kv_cache_dtype, dtype, block_size, cfg.num_kv_heads, cfg.head_dim)

    @classmethod
    def num_kv_cache_layers(cls, cfg: ModelConfig) -> int:
        return cfg.num_layers

    @classmethod
    def kv_bytes_per_token(cls, cfg: ModelConfig, kv_cache_dtype: str, dtype: torch.dtype, block_size: int) -> float:
        spec = cls.kv_cache_spec(cfg, kv_cache_dtype, dtype, block_size)
        return spec.bytes_per_token * cls.num_kv_cache_layers(cfg)

    @classmethod
    def allocate_kv_caches(cls, cfg: ModelConfig, kv_cache_dtype: str, dtype: torch.dtype, block_size: int,
                           num_blocks: int) -> list[tuple[torch.Tensor, ...]]:
        spec = cls.kv_cache_spec(cfg, kv_cache_dtype, dtype, block_size).with_num_blocks(num_blocks)
        return [spec.allocate() for _ in range(cls.num_kv_cache_layers(cfg))]

    # -- hooks: forward ------------------------------------------------------------------------
    def forward_first_layers(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list,
                             backend: AttentionBackend, meta: object, num_layers: int) -> torch.Tensor:
        """Final-normed hidden states after only the first num_layers layers (an early exit):
        the layers' KV goes to the same caches as a full forward's."""
        if not 1 <= num_layers <= len(kv_caches):
            raise ValueError(f"num_layers must be in [1, {len(kv_caches)}], got {num_layers}")
        return self(input_ids, positions, kv_caches[:num_layers], backend, meta)

    # -- hooks: weights ------------------------------------------------------------------------
    def map_checkpoint_name(self, name: str) -> tuple[str, int | None]:
        """Checkpoint tensor name -> (our parameter name, shard index in a fused module or None)."""
        name = name.removeprefix(self.checkpoint_prefix)
        module, _, kind = name.rpartition(".")
        for ckpt_module, (ours, shard) in self.stacked_params.items():
            if module.endswith("." + ckpt_module):
                return f"{module[: -len(ckpt_module)]}{ours}.{kind}", shard
        return name, None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Returns the names of the parameters that received a tensor."""
        params = dict(self.named_parameters(remove_duplicate=False))
        modules = dict(self.named_modules(remove_duplicate=False))
        loaded: set[str] = set()
        for ckpt_name, tensor in weights:
            if self.skip_weight(ckpt_name):
                continue
            name, shard = self.map_checkpoint_name(ckpt_name)
            if name not in params:
                raise ValueError(f"unexpected weight {ckpt_name!r} for {type(self).__name__}")
            module_name, _, param_name = name.rpartition(".")
            module = modules[module_name]
            if isinstance(module, Linear):
                module.load_weight(param_name, tensor, shard)
            else:
                _copy_checked(ckpt_name, params[name], tensor)
            loaded.add(name)
        return loaded

    def skip_weight(self, ckpt_name: str) -> bool:
        """Checkpoint tensors this model does not hold (rotary caches; with expert parallelism,
        other processes' experts)."""
        return any(part in ckpt_name for part in self.ignored_weights)

    def tie_weights(self) -> None:
        """Re-establish shared parameters (e.g. tied embeddings); called again after to_empty()."""

    def process_weights_after_loading(self) -> None:
        """Every tensor is in: let each Linear's quant method repack its weight."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.quant_method.load(module)


def _copy_checked(name: str, param: torch.Tensor, tensor) -> None:
    if hasattr(tensor, "dequantize"):  # a quantized checkpoint tensor for a float parameter (embedding)
        tensor = tensor.dequantize()
    if param.shape != tensor.shape:
        raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)}, expected {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))
