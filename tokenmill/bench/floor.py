"""The floor of an offline workload on this machine: how fast it could possibly run.

Three terms, each at the machine's measured best rate, added (no overlap assumed between them):
- the linear layers: 2 x parameters FLOPs per token through the model: every prompt token (the
  lm_head only for the last one, which samples the first output) and every output but the last
  fed back (with the lm_head), over the measured matmul peak;
- prefill attention: QK^T and PV of a causal prompt, 4 x heads x head_dim x L^2 / 2 FLOPs per
  layer, over the same peak;
- decode attention: every decode step reads its whole context's K and V (its own token's
  included) once per layer (`kv_bytes_per_token` covers all layers), over the measured memory read
  bandwidth.

A dense model is assumed (every parameter of every layer used by every token). Weights read per
decode step are left out: at the batch sizes of these workloads the weights (re-read once per step
for the whole batch) are small next to the compute, so the floor errs on the fast side.
"""
from __future__ import annotations

from dataclasses import dataclass

from tokenmill.bench.offline import Workload


@dataclass(frozen=True)
class Floor:
    linear_s: float
    prefill_attention_s: float
    decode_kv_s: float
    output_tokens: int

    @property
    def seconds(self) -> float:
        return self.linear_s + self.prefill_attention_s + self.decode_kv_s

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.seconds

    def summary(self) -> dict:
        return {"seconds": self.seconds, "output_tok_s": self.output_tok_s, "linear_s": self.linear_s,
                "prefill_attention_s": self.prefill_attention_s, "decode_kv_s": self.decode_kv_s}


def layer_params(arch) -> int:
    """Weights of one dense decoder layer's linears (q, k, v, o, gate, up, down)."""
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    return arch.hidden_size * (q + 2 * kv) + q * arch.hidden_size + 3 * arch.hidden_size * arch.intermediate_size


def workload_floor(arch, wl: Workload, kv_bytes_per_token: float, matmul_gflops: float,
                   read_gbps: float) -> Floor:
    body = layer_params(arch) * arch.num_layers
    head = arch.hidden_size * arch.vocab_size
    prompt_tokens, output_tokens = sum(map(len, wl.prompts)), sum(wl.output_lens)
    steps = sum(max(o - 1, 0) for o in wl.output_lens)  # decode forwards: outputs fed back
    linear = 2 * body * (prompt_tokens + steps) + 2 * head * (len(wl.prompts) + steps)
    attention = sum(4 * arch.num_heads * arch.head_dim * len(p) ** 2 / 2 for p in wl.prompts) * arch.num_layers
    # decode forward i (0-based) of a request attends to the prompt and outputs 0..i
    context_reads = sum((o - 1) * len(p) + (o - 1) * o / 2 for p, o in zip(wl.prompts, wl.output_lens) if o > 1)
    return Floor(linear_s=linear / (matmul_gflops * 1e9), prefill_attention_s=attention / (matmul_gflops * 1e9),
                 decode_kv_s=context_reads * kv_bytes_per_token / (read_gbps * 1e9), output_tokens=output_tokens)
