"""Where a performance model's rates come from: accelerator datasheets (profiles/hardware.yaml,
user-editable) or a profile measured on this machine (`tokenmill sim profile`, JSON)."""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from tokenmill.sim.model_shape import ModelShape
from tokenmill.sim.perf_model import Interconnect, PerfCoefficients, PerfModel, ServingOverhead

PROFILES = resources.files("tokenmill.sim") / "profiles"
HARDWARE_YAML = PROFILES / "hardware.yaml"
DEFAULT_CPU_PROFILE = PROFILES / "cpu_smollm2_135m.json"


@dataclass(frozen=True)
class Hardware:
    key: str
    name: str
    bf16_tflops: float
    fp8_tflops: float | None
    hbm_gbps: float
    hbm_gb: float
    interconnect_gbps: float
    price_per_hour: float
    price_source: str
    efficiency: dict[str, float]

    def coefficients(self, weight_dtype: str = "bfloat16") -> PerfCoefficients:
        """Peaks × efficiencies. fp8 weights use the fp8 peak where the device has one."""
        peak = self.fp8_tflops if weight_dtype == "fp8" and self.fp8_tflops else self.bf16_tflops
        e = self.efficiency
        return PerfCoefficients(
            linear_flops_per_s=peak * 1e12 * e["linear_efficiency"],
            attention_flops_per_s=self.bf16_tflops * 1e12 * e["attention_efficiency"],
            mem_bytes_per_s=self.hbm_gbps * 1e9 * e["memory_efficiency"],
            step_overhead_s=e["step_overhead_s"], per_seq_s=e["per_seq_s"], per_token_s=e["per_token_s"])

    def slice(self, k: int) -> Hardware:
        """One of k equal spatial partitions (MIG-like): 1/k of the compute, bandwidth, memory and
        price; the per-step host overhead stays whole (each partition runs its own engine)."""
        return replace(self, key=f"{self.key}/{k}", name=f"1/{k} {self.name}", bf16_tflops=self.bf16_tflops / k,
                       fp8_tflops=None if self.fp8_tflops is None else self.fp8_tflops / k,
                       hbm_gbps=self.hbm_gbps / k, hbm_gb=self.hbm_gb / k, price_per_hour=self.price_per_hour / k)

    @property
    def interconnect(self) -> Interconnect:
        return Interconnect(self.interconnect_gbps * 1e9, self.efficiency["link_latency_s"])

    def usable_memory_bytes(self) -> float:
        return self.hbm_gb * 1e9 * (1 - self.efficiency["memory_reserved_fraction"])

    def perf_model(self, shape: ModelShape, weight_dtype: str = "bfloat16", kv_dtype: str = "bfloat16",
                   tp: int = 1) -> PerfModel:
        return PerfModel(shape, self.coefficients(weight_dtype), weight_dtype, kv_dtype, tp=tp,
                         interconnect=self.interconnect if tp > 1 else None)


def load_hardware(path: str | Path | None = None) -> dict[str, Hardware]:
    import yaml

    text = Path(path).read_text(encoding="utf-8") if path else HARDWARE_YAML.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    defaults = data.get("defaults", {})
    out = {}
    for key, d in (data.get("devices") or {}).items():
        eff = {**defaults, **(d.get("efficiency") or {})}
        try:
            out[key] = Hardware(key, d["name"], float(d["bf16_tflops"]),
                                None if d.get("fp8_tflops") is None else float(d["fp8_tflops"]),
                                float(d["hbm_gbps"]), float(d["hbm_gb"]), float(d["interconnect_gbps"]),
                                float(d["price_per_hour"]), str(d.get("price_source", "")), eff)
        except KeyError as e:
            raise ValueError(f"hardware profile {key!r} lacks field {e.args[0]!r}") from None
    return out


def get_hardware(keys: str, path: str | Path | None = None) -> list[Hardware]:
    """'h100,a100' -> their profiles; an unknown name is an error listing the known ones."""
    table = load_hardware(path)
    picked = []
    for key in (k.strip().lower() for k in keys.split(",") if k.strip()):
        if key not in table:
            raise ValueError(f"--hardware: unknown device {key!r} (known: {', '.join(table)})")
        picked.append(table[key])
    if not picked:
        raise ValueError("--hardware needs at least one device")
    return picked


# -- measured profiles -----------------------------------------------------------------------------

def load_profile(path: str | Path | None = None) -> dict[str, Any]:
    p = Path(path) if path else DEFAULT_CPU_PROFILE
    try:
        data = json.loads(Path(str(p)).read_text(encoding="utf-8"))
        PerfCoefficients(**data["coefficients"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--profile: {p} is not a tokenmill sim profile: {e}") from None
    return data


def profile_perf_model(profile: dict[str, Any], shape: ModelShape | None = None) -> PerfModel:
    shape = shape or ModelShape(**profile["model_shape"])
    serving = profile.get("serving")
    return PerfModel(shape, PerfCoefficients(**profile["coefficients"]), profile.get("weight_dtype", "bfloat16"),
                     profile.get("kv_dtype", "bfloat16"),
                     serving=ServingOverhead(**serving["terms"]) if serving else None)
