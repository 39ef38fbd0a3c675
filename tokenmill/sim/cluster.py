"""A cluster configuration (what `tokenmill sim` flags and the planner's search both describe) and
the replica specs it builds, from a hardware datasheet profile or a profile measured here."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from tokenmill.core.kv_cache_manager import cdiv
from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.sim.hardware import Hardware, profile_perf_model
from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.simulator import KVTransfer, ReplicaSpec

WEIGHT_DTYPES = ("bfloat16", "fp8", "int8", "int4")
KV_DTYPES = ("bfloat16", "fp8", "int8")


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 1  # unified replicas (ignored when prefill_replicas > 0)
    tp: int = 1
    decode_tp: int | None = None  # disaggregated: the decode replicas' own TP degree (default: tp)
    prefill_replicas: int = 0  # >0: disaggregated, with decode_replicas
    decode_replicas: int = 0
    max_num_batched_tokens: int = 1024
    max_num_seqs: int = 128
    max_model_len: int = 8192
    long_prefill_token_threshold: int = 0
    one_prompt_end_per_step: bool = False  # as `tokenmill serve` schedules (core/scheduler.py)
    block_size: int = 16
    enable_prefix_caching: bool = True
    num_kv_blocks: int | None = None  # None: what the memory left after the weights holds
    kv_memory_fraction: float = 1.0  # share of that memory given to KV (the planner's KV budget lever)
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    router: str = "least-loaded"
    link_gbps: float | None = None  # KV transfer bandwidth, GB/s (default: the device interconnect)
    link_latency_s: float = 1e-4
    decode_hardware: str | None = None  # a mixed pool: decode replicas on another device kind
    continuous_batching: bool = True
    partitions: int = 1  # >1: spatial partitioning, this many replicas share each device (MIG-like slices)

    def __post_init__(self) -> None:
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"weight_dtype must be one of {', '.join(WEIGHT_DTYPES)}, got {self.weight_dtype!r}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {self.kv_dtype!r}")
        for name in ("replicas", "tp", "decode_tp"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if (self.prefill_replicas > 0) != (self.decode_replicas > 0):
            raise ValueError("prefill_replicas and decode_replicas go together (both > 0, or both 0)")
        if self.decode_tp is not None and not self.disaggregated:
            raise ValueError("decode_tp needs prefill and decode replicas")
        if self.partitions < 1 or (self.partitions > 1 and self.tp > 1):
            raise ValueError(f"partitions must be >= 1 and needs tp 1, got partitions={self.partitions} tp={self.tp}")
        if not 0 < self.kv_memory_fraction <= 1:
            raise ValueError(f"kv_memory_fraction must be in (0, 1], got {self.kv_memory_fraction}")

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0

    def tp_of(self, role: str) -> int:
        return self.decode_tp if role == "decode" and self.decode_tp is not None else self.tp

    @property
    def num_devices(self) -> float:
        if self.disaggregated:
            return self.prefill_replicas * self.tp + self.decode_replicas * self.tp_of("decode")
        return self.replicas * self.tp / self.partitions

    def scheduler(self) -> SchedulerConfig:
        return SchedulerConfig(self.max_num_batched_tokens, self.max_num_seqs, self.max_model_len,
                               self.long_prefill_token_threshold,
                               one_prompt_end_per_step=self.one_prompt_end_per_step)

    def label(self) -> str:
        pool = f"{self.prefill_replicas}P:{self.decode_replicas}D" if self.disaggregated else f"{self.replicas}x"
        tp = f"TP{self.tp}" if self.tp_of("decode") == self.tp else f"TP{self.tp}/{self.decode_tp}"
        return (f"{pool} {tp} batch{self.max_num_batched_tokens} w={self.weight_dtype} kv={self.kv_dtype}"
                + ("" if self.kv_memory_fraction == 1 else f" kvmem={self.kv_memory_fraction:g}")
                + ("" if self.enable_prefix_caching else " no-prefix-cache")
                + ("" if self.continuous_batching else " static-batching")
                + ("" if self.partitions == 1 else f" {self.partitions}-per-device"))


def hardware_replica(cfg: ClusterConfig, hw: Hardware, shape: ModelShape, role: str) -> ReplicaSpec:
    if cfg.partitions > 1:
        hw = hw.slice(cfg.partitions)
    tp = cfg.tp_of(role)
    perf = hw.perf_model(shape, cfg.weight_dtype, cfg.kv_dtype, tp)
    blocks = cfg.num_kv_blocks
    if blocks is None:
        free = hw.usable_memory_bytes() * tp - perf.weight_bytes
        blocks = int(free * cfg.kv_memory_fraction // (perf.kv_bytes_per_token * cfg.block_size))
        if blocks < cdiv(cfg.max_model_len, cfg.block_size):
            raise ValueError(f"{shape.name} in {cfg.weight_dtype} does not fit {tp} x {hw.key} with room "
                             f"for one {cfg.max_model_len}-token request")
    return ReplicaSpec(perf, cfg.scheduler(), blocks, cfg.block_size, cfg.enable_prefix_caching, role,
                       hw.price_per_hour * tp, cfg.continuous_batching)


def build_cluster(cfg: ClusterConfig, shape: ModelShape, hardware: dict[str, Hardware] | None = None,
                  device: str | None = None, profile: dict[str, Any] | None = None,
                  price_per_hour: float = 0.0) -> tuple[list[ReplicaSpec], KVTransfer | None]:
    """Replica specs and the KV transfer model. Either `device` (a key of `hardware`) or a measured
    `profile` (`price_per_hour` per replica then)."""
    roles = (["prefill"] * cfg.prefill_replicas + ["decode"] * cfg.decode_replicas
             if cfg.disaggregated else ["unified"] * cfg.replicas)
    if profile is not None:
        perf = profile_perf_model(profile, shape)
        perf = replace(perf, weight_dtype=cfg.weight_dtype if cfg.weight_dtype != "bfloat16" else perf.weight_dtype,
                       kv_dtype=cfg.kv_dtype if cfg.kv_dtype != "bfloat16" else perf.kv_dtype)
        blocks = cfg.num_kv_blocks or int(profile["num_kv_blocks"])
        specs = [ReplicaSpec(perf, cfg.scheduler(), blocks, cfg.block_size, cfg.enable_prefix_caching, r,
                             price_per_hour, cfg.continuous_batching) for r in roles]
        link = KVTransfer((cfg.link_gbps or 10.0) * 1e9, cfg.link_latency_s) if cfg.disaggregated else None
        return specs, link
    assert hardware is not None and device is not None
    hw = hardware[device]
    decode_hw = hardware[cfg.decode_hardware] if cfg.decode_hardware else hw
    specs = [hardware_replica(cfg, decode_hw if r == "decode" else hw, shape, r) for r in roles]
    link = None
    if cfg.disaggregated:
        gbps = cfg.link_gbps or min(hw.interconnect_gbps, decode_hw.interconnect_gbps)
        link = KVTransfer(gbps * 1e9, cfg.link_latency_s)
    return specs, link


