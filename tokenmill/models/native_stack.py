"""A step of a Llama-family model (decodes, prompt chunks or both) in one C++ call
(kernels/csrc/layer_stack.cpp).

The Python layers spend ~55 µs a layer between their kernels (module calls, views, the dispatcher):
1.6 ms of a 14 ms batch-1 decode step of SmolLM2-135M; in the server every kernel call also gives
the GIL to the HTTP loop and waits to take it back. `layer_stack` runs the same kernels in the same
order on the same tensors, so its output is bit-identical to the layers'; it applies when
- every layer is the plain Llama decoder layer (no q/k norm, a SwiGLU MLP, RMSNorm),
- every linear layer's weight format has a native kernel (`LinearMethod.native`: our float32 or bf16
  panels, 4- and 8-bit block records; oneDNN, plain and input-permuted weights keep the Python path),
- the attention backend hands over the step (`AttentionBackend.step_inputs`: only the cpu backend,
  over a plain float32/bf16 cache, when no layer's sliding window binds a prompt chunk),
and the activations are float32. Anything else, or TOKENMILL_NATIVE_STACK=0, runs the layers;
TOKENMILL_NATIVE_STACK=decode takes pure decode steps only (as before prompt chunks were added; for
A/B runs). A step while any forward hook is registered on a layer's module (AWQ calibration hooks
the linear layers) runs the layers, so the hooks see every call.
"""
from __future__ import annotations

import os

import torch
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from tokenmill.attention.backend import AttentionBackend
from tokenmill.kernels import cpu_ops
from tokenmill.models.layers import RMSNorm, SwiGLU


class NativeLayerStack:
    """The layers' tensors and shapes, gathered once after loading (the packed weights do not change)."""

    def __init__(self, weights: list[torch.Tensor], layer_ints: list[int], dims: list[int], eps: float,
                 scale: float, decode_only: bool = False) -> None:
        self.weights, self.layer_ints, self.dims, self.eps, self.scale = weights, layer_ints, dims, eps, scale
        self.windows = set(layer_ints[5::6])  # each layer's sliding window, 0 for none
        self.decode_only = decode_only
        self.hook_dicts: list[dict] = []  # the layers' modules' hook tables (only the Python layers call them)

    @classmethod
    def build(cls, model) -> NativeLayerStack | None:
        """None where any layer is outside what layer_stack computes."""
        mode = os.environ.get("TOKENMILL_NATIVE_STACK", os.environ.get("TOKENMILL_NATIVE_DECODE", "1"))
        if mode == "0" or not cpu_ops.load():
            return None
        from tokenmill.models.llama import Attention, DecoderLayer
        weights: list[torch.Tensor] = []
        ints: list[int] = []
        shapes = set()
        empty = torch.empty(0)  # no bias
        for layer in model.layers:
            attn, mlp = layer.self_attn, getattr(layer, layer.mlp_name)
            if (type(layer) is not DecoderLayer or type(attn) is not Attention or attn.q_norm is not None
                    or type(mlp) is not SwiGLU or type(layer.input_layernorm) is not RMSNorm
                    or type(layer.post_attention_layernorm) is not RMSNorm
                    or layer.input_layernorm.weight.dtype != torch.float32):
                return None
            linears = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
            native = [lin.quant_method.native(lin) for lin in linears]
            if any(n is None for n in native) or mlp.gate_up_proj.output_sizes != [mlp.intermediate] * 2:
                return None
            weights += [layer.input_layernorm.weight.detach()]
            for i, n in enumerate(native):
                weights += [n.packed, empty if n.bias is None else n.bias.detach()]
                if i == 1:
                    weights.append(layer.post_attention_layernorm.weight.detach())
            fused = mlp.gate_up_proj.quant_method.swiglu_fusable(mlp.gate_up_proj, mlp.down_proj)
            ints += [n.kind for n in native] + [int(fused), attn.sliding_window or 0]
            shapes.add((attn.num_heads, attn.num_kv_heads, attn.head_dim, mlp.intermediate, attn.scale,
                        layer.input_layernorm.eps, layer.post_attention_layernorm.eps))
        if len(shapes) != 1:
            return None
        heads, kv_heads, head_dim, inter, scale, eps, post_eps = shapes.pop()
        if eps != post_eps:
            return None
        stack = cls(weights, ints, [heads, kv_heads, head_dim, inter], eps, scale, decode_only=mode == "decode")
        stack.hook_dicts = [d for layer in model.layers for m in layer.modules()
                            for d in (m._forward_hooks, m._forward_pre_hooks)]
        return stack

    def run(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], kv_caches: list,
            backend: AttentionBackend, meta) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(last MLP output, residual) after the first len(kv_caches) layers, as the Python layers
        return them; None where this step is not one layer_stack takes."""
        if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous() or self._hooked():
            return None
        inputs = backend.step_inputs(meta, kv_caches, self.windows)
        if inputs is None or (self.decode_only and inputs.chunk_ints):
            return None
        kv = [t for cache in kv_caches for t in cache]
        hidden, residual = torch.ops.tokenmill.layer_stack(
            x, self.weights, kv, cos_sin[0], cos_sin[1], inputs.slot_mapping, inputs.decode_rows, inputs.block_tables,
            inputs.seq_lens, inputs.chunk_ints, inputs.chunk_blocks, [len(kv_caches), *self.dims, inputs.block_size],
            self.layer_ints, self.eps, self.scale)
        return hidden, residual

    def _hooked(self) -> bool:
        """Any forward hook registered (register_forward_hook adds to these tables in place)."""
        return bool(_global_forward_hooks or _global_forward_pre_hooks) or any(self.hook_dicts)
