"""The performance model: one engine step's duration from the batch's composition.

    step = overhead + per_seq·S + per_token·T + per_kv_token·K
         + max(linear FLOPs / F_lin, weight bytes / B)          # GEMMs: compute or weight-read bound
         + max(attention FLOPs / F_attn, KV bytes read / B)     # attention: compute or KV-read bound
         + tensor-parallel all-reduces (2 per layer: bytes / link bandwidth + latency)
         + serving: stream_per_step + stream_per_seq·(requests given a token this step)

F and B are *effective* rates (peak × efficiency): fitted on this machine by `tokenmill sim profile`,
or a datasheet's peaks times assumed efficiencies (`hardware.py`). The per-class terms say which
resource binds a step (compute, HBM bandwidth), which the planner reports.

`ServingOverhead` is what the HTTP server adds around the engine step (`tokenmill sim profile
--serve` measures it through a live `tokenmill serve`): the engine loop thread and the asyncio
thread share one GIL (and here two cores with the benchmark client), so every streamed token's
work (the loop's `call_soon_threadsafe` hand-off, the output delta, its JSON and SSE write, the
client reading it) lengthens the engine's steps, and a request reaches the scheduler only after
its HTTP request is parsed and its prompt tokenized (`admission_s`). Datasheet profiles have none.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from tokenmill.core.scheduler_output import SchedulerOutput
from tokenmill.sim.model_shape import ModelShape


@dataclass(frozen=True)
class BatchShape:
    num_prefill_tokens: int = 0  # tokens of requests still inside their prompt
    num_decode_tokens: int = 0  # tokens of requests past their prompt (1 each, more with drafts)
    num_seqs: int = 0
    attention_pairs: int = 0  # Σ over scheduled tokens of the context each attends to
    kv_tokens_read: int = 0  # Σ over requests of the context their attention reads
    num_output_seqs: int = 0  # requests given a token by this step (decoding, or finishing their prompt)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode_tokens


def batch_shape(out: SchedulerOutput, computed: dict[str, int], prompt_len: dict[str, int],
                free_tokens: dict[str, int] | None = None) -> BatchShape:
    """The shape of a scheduled step. `computed`: KV tokens valid before the step per request;
    `prompt_len`: prompt tokens per request; `free_tokens`: tokens whose KV arrived by transfer
    (a decode replica adopting a prefill's KV: no compute for them)."""
    free_tokens = free_tokens or {}
    prefill = decode = pairs = kv = seqs = emitting = 0
    for rid, n in out.num_scheduled_tokens.items():
        c0 = computed[rid]
        skip = max(0, min(n, free_tokens.get(rid, 0) - c0))
        c0, n = c0 + skip, n - skip
        if n <= 0:
            continue
        in_prompt = max(0, min(n, prompt_len[rid] - c0))
        prefill += in_prompt
        decode += n - in_prompt
        pairs += n * c0 + n * (n + 1) // 2
        kv += c0 + n
        seqs += 1
        emitting += c0 + n >= prompt_len[rid]
    return BatchShape(prefill, decode, seqs, pairs, kv, emitting)


@dataclass(frozen=True)
class PerfCoefficients:
    linear_flops_per_s: float  # effective GEMM rate
    attention_flops_per_s: float  # effective attention rate
    mem_bytes_per_s: float  # effective memory (HBM / DRAM) bandwidth
    step_overhead_s: float = 0.0  # fixed per step (scheduling, launch, sampling, output)
    per_seq_s: float = 0.0  # per request in the batch (bookkeeping, sampling, detokenizing)
    per_token_s: float = 0.0  # per scheduled token (embedding, norms, rope, elementwise)
    per_kv_token_s: float = 0.0  # per context token a request's attention reads (a decode query's kernel
    #                              walks its KV blocks: on a CPU slower than the KV bytes alone say)

    def __post_init__(self) -> None:
        for name, v in asdict(self).items():
            if not v >= 0:
                raise ValueError(f"{name} must be >= 0, got {v}")
        for name in ("linear_flops_per_s", "attention_flops_per_s", "mem_bytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class ServingOverhead:
    """The serving path's cost beyond `LLMEngine.step()` (all seconds, all >= 0)."""
    admit_s: float = 0.0  # per request: HTTP parse, validation, hand-over to the engine loop
    admit_per_prompt_token_s: float = 0.0  # per prompt token: tokenization
    stream_per_step_s: float = 0.0  # per step that gives any request a token: dispatch to asyncio
    stream_per_seq_s: float = 0.0  # per request given a token: delta, JSON, SSE write (steals the GIL)

    def __post_init__(self) -> None:
        for name, v in asdict(self).items():
            if not v >= 0:
                raise ValueError(f"serving.{name} must be >= 0, got {v}")

    def admission_s(self, prompt_len: int) -> float:
        """Arrival to the request reaching the scheduler."""
        return self.admit_s + self.admit_per_prompt_token_s * prompt_len

    def stream_s(self, num_output_seqs: int) -> float:
        """What streaming one step's tokens adds to the step."""
        return self.stream_per_step_s + self.stream_per_seq_s * num_output_seqs if num_output_seqs else 0.0


@dataclass(frozen=True)
class Interconnect:
    bytes_per_s: float  # per-device link bandwidth (NVLink, Infinity Fabric, HCCS, PCIe)
    latency_s: float = 5e-6


@dataclass(frozen=True)
class PerfModel:
    shape: ModelShape
    coeff: PerfCoefficients
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    activation_bytes: float = 2.0
    tp: int = 1  # tensor-parallel degree: FLOPs and bytes split over tp devices
    interconnect: Interconnect | None = None
    serving: ServingOverhead | None = None  # a measured server's path around the step; None: engine only

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if self.tp > 1 and self.interconnect is None:
            raise ValueError("tp > 1 needs an interconnect (link bandwidth) for its all-reduces")

    @property
    def weight_bytes(self) -> float:
        return self.shape.weight_bytes(self.weight_dtype)

    @property
    def kv_bytes_per_token(self) -> float:
        return self.shape.kv_bytes_per_token(self.kv_dtype)

    def breakdown(self, b: BatchShape) -> dict[str, float]:
        """Seconds per operator class for one step (their sum is the step time)."""
        c, s, tp = self.coeff, self.shape, self.tp
        t = b.num_tokens
        lin_compute = t * s.linear_flops_per_token / tp / c.linear_flops_per_s
        lin_memory = self.weight_bytes / tp / c.mem_bytes_per_s
        attn_compute = b.attention_pairs * s.attention_flops_per_pair / tp / c.attention_flops_per_s
        attn_memory = b.kv_tokens_read * self.kv_bytes_per_token / tp / c.mem_bytes_per_s
        comm = 0.0
        if tp > 1 and t > 0:
            link = self.interconnect
            volume = 2 * (tp - 1) / tp * t * s.hidden_size * self.activation_bytes
            comm = 2 * s.num_layers * (link.latency_s + volume / link.bytes_per_s)
        return {
            "overhead": c.step_overhead_s + c.per_seq_s * b.num_seqs + c.per_token_s * t
            + c.per_kv_token_s * b.kv_tokens_read,
            "linear_compute": lin_compute if lin_compute >= lin_memory else 0.0,
            "weight_read": lin_memory if lin_memory > lin_compute else 0.0,
            "attention_compute": attn_compute if attn_compute >= attn_memory else 0.0,
            "kv_read": attn_memory if attn_memory > attn_compute else 0.0,
            "communication": comm,
            "serving": self.serving.stream_s(b.num_output_seqs) if self.serving is not None else 0.0,
        }

    def step_time(self, b: BatchShape) -> float:
        if b.num_seqs == 0:
            return self.coeff.step_overhead_s
        return sum(self.breakdown(b).values())

    def describe(self) -> dict:
        return {"model": self.shape.name, "weight_dtype": self.weight_dtype, "kv_dtype": self.kv_dtype,
                "tp": self.tp, "coefficients": asdict(self.coeff),
                "serving": asdict(self.serving) if self.serving is not None else None}
