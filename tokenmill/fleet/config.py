"""The fleet's configuration file (YAML): pools, SLO classes and tenants, validated by pydantic.

    pools:
      - {name: premium, model: default, replicas: 1, hardware: {name: h100-class, price_per_hour: 4.0, cores: [0]}}
      - {name: economy, model: default, replicas: 1, hardware: {name: cpu-class, price_per_hour: 0.5, cores: [1]}}
    slo_classes:
      interactive: {ttft_ms: 1500, tpot_ms: 250}
      batch: {}
    tenants:
      acme: {api_key: KEY_A, slo_class: interactive}
      globex: {api_key: KEY_B, slo_class: batch}

A pool is one model served by `replicas` engines (`tokenmill serve` processes, or with
`launcher: ray` Ray actors on the nodes its `ray.resources` name, restarted by Ray when they die) with one engine
configuration (`engine`: `tokenmill serve` flags, snake_case) on one hardware profile (a name, a
price, and the CPU cores its engines are pinned to: without `cores` the engines share every core,
time-sliced; with them each pool's engines run on their own cores, the CPU analogue of MIG; pools
with the same `switch_group` take turns, one awake and the others asleep: see switching.py; a pool
with `models: [{model, path, engine}, ...]` instead of `model` runs each replica as one
`tokenmill serve-multi` process holding all of them, one awake at a time). An SLO
class without targets is best effort (`batch`): it waits for idle capacity and is shed first. Any
unknown or wrong field is an error naming it (`pools.1.hardware.price_per_hour: ...`).
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# flags the fleet sets itself for every replica
RESERVED_ENGINE_FLAGS = {"model", "host", "port", "served_model_name", "price_per_hour", "api_key", "enable_sleep_mode"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hardware(_Strict):
    name: str = Field(min_length=1)
    price_per_hour: float = Field(ge=0, description="USD per hour of one replica's device")
    cores: list[int] | None = Field(default=None, min_length=1, description="CPU cores to pin each replica to")

    @field_validator("cores")
    @classmethod
    def _cores_exist(cls, cores: list[int] | None) -> list[int] | None:
        if cores is None:
            return None
        allowed = sorted(os.sched_getaffinity(0))
        bad = [c for c in cores if c not in allowed]
        if bad:
            raise ValueError(f"cores {bad} are not available here; allowed: {allowed}")
        if len(set(cores)) != len(cores):
            raise ValueError(f"cores {cores} repeat a core")
        return cores


class RayPool(_Strict):
    """Where a `launcher: ray` pool's replicas run: Ray actors that need these resources."""
    resources: dict[str, float] = Field(default_factory=dict, description="custom Ray resources each replica's "
                                        "actor needs: they pick the node(s), e.g. {node_b: 0.01}")
    num_cpus: float = Field(default=1.0, gt=0, description="CPUs each replica reserves (its engine's threads)")
    max_restarts: int = Field(default=3, ge=-1, description="times Ray restarts a dead replica (-1: always)")
    first_port: int | None = Field(default=None, ge=1024, le=65535, description="replica i listens on first_port "
                                   "+ i on its node (default: a port free on this machine)")


def _check_engine(engine: dict[str, Any]) -> dict[str, Any]:
    reserved = sorted(RESERVED_ENGINE_FLAGS & set(engine))
    if reserved:
        raise ValueError(f"{reserved} are set by the fleet, not in `engine`")
    replica_argv(engine)  # raises naming the flag
    return engine


class PoolModel(_Strict):
    """One of the models a `models:` pool's engine process holds (tokenmill serve-multi)."""
    model: str = Field(min_length=1, description="the name requests use in their `model` field")
    path: str | None = Field(default=None, description="model folder (default: `model`; 'default' = the "
                                                       "built-in SmolLM2-135M-Instruct)")
    engine: dict[str, str | int | float | bool | list[str]] = Field(default_factory=dict,
                                                                     description="flags of this model alone")

    @field_validator("engine")
    @classmethod
    def _engine_flags(cls, engine: dict[str, Any]) -> dict[str, Any]:
        return _check_engine(engine)

    @property
    def model_path(self) -> str | None:
        path = self.path or self.model
        return None if path == "default" else path


class Pool(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    model: str | None = Field(default=None, min_length=1, description="the name requests use in their `model` "
                              "field (or `models`)")
    models: list[PoolModel] | None = Field(default=None, min_length=2, description="several models in one "
                                             "engine process per replica, one awake at a time (sleep mode)")
    switch_quantum_s: float = Field(default=2.0, ge=0, description="a `models:` pool: how long a request for a "
                                    "sleeping model waits before the awake one stops taking new requests")
    path: str | None = Field(default=None, description="model folder (default: `model`; 'default' = the "
                                                       "built-in SmolLM2-135M-Instruct)")
    replicas: int = Field(default=1, ge=1, le=64)
    hardware: Hardware
    engine: dict[str, str | int | float | bool | list[str]] = Field(default_factory=dict)
    max_concurrency: int = Field(default=8, ge=1, description="requests one replica runs at once before the "
                                                              "fleet queues more (its capacity)")
    switch_group: str | None = Field(default=None, min_length=1, description="pools of one switch group take "
                                     "turns on the device: one awake, the others asleep (KV cache released)")
    launcher: Literal["process", "ray"] = Field(default="process", description="process: replicas are "
                                                "processes on this machine; ray: Ray actors (tokenmill[ray])")
    ray: RayPool | None = Field(default=None, description="placement of a `launcher: ray` pool")

    @field_validator("engine")
    @classmethod
    def _engine_flags(cls, engine: dict[str, Any]) -> dict[str, Any]:
        return _check_engine(engine)

    @model_validator(mode="after")
    def _launcher(self) -> Pool:
        if (self.model is None) == (self.models is None):
            raise ValueError("model, models: give exactly one (one model, or several in one process)")
        if self.models is not None:
            names = [m.model for m in self.models]
            if len(set(names)) != len(names):
                raise ValueError(f"models: names must be unique, got {names}")
            if self.path is not None:
                raise ValueError("path: a `models:` pool gives each model's path in `models`")
            if self.launcher != "process" or self.switch_group is not None:
                raise ValueError("models: a pool holding several models is one `launcher: process` engine "
                                 "process per replica, not in a switch_group")
        if self.launcher == "ray":
            if self.hardware.cores is not None:
                raise ValueError("hardware.cores: a `launcher: ray` pool is placed by Ray (ray.resources, "
                                 "ray.num_cpus), not pinned to this machine's cores")
            if self.switch_group is not None:
                raise ValueError("switch_group: only `launcher: process` pools take turns on one device")
        elif self.ray is not None:
            raise ValueError("ray: only for `launcher: ray` pools")
        return self

    @property
    def ray_placement(self) -> RayPool:
        return self.ray or RayPool()

    @property
    def served_models(self) -> list[str]:
        return [m.model for m in self.models] if self.models is not None else [self.model]

    @property
    def model_label(self) -> str:
        """The pool's model(s) as one label: `a` or `a+b`."""
        return "+".join(self.served_models)

    @property
    def model_path(self) -> str | None:
        """What `tokenmill serve` gets as MODEL (None: the built-in default model)."""
        path = self.path or self.model
        return None if path == "default" else path


class SLOClass(_Strict):
    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    max_queue_s: float = Field(default=30.0, ge=0, description="longest a request of the class waits in the "
                                                                "fleet's queue before 429")

    @property
    def best_effort(self) -> bool:
        return self.ttft_ms is None and self.tpot_ms is None


class Tenant(_Strict):
    api_key: str = Field(min_length=1)
    slo_class: str


class FleetConfig(_Strict):
    pools: list[Pool] = Field(min_length=1)
    slo_classes: dict[str, SLOClass] = Field(min_length=1)
    tenants: dict[str, Tenant] = Field(min_length=1)
    ledger: str = Field(default="tokenmill-ledger.sqlite", description="append-only SQLite cost ledger")
    max_queue: int = Field(default=64, ge=0, description="requests the fleet holds waiting for capacity")
    switch_quantum_s: float = Field(default=2.0, ge=0, description="in a switch group, how long a request for a "
                                    "sleeping pool waits before the awake pool stops taking new requests")
    ray_address: str | None = Field(default=None, description="the Ray cluster of `launcher: ray` pools "
                                    "(default: RAY_ADDRESS or a local `ray start` head)")
    latency_prediction: Literal["load", "ewma"] = Field(default="load", description="how the router predicts "
                                                       "a pool's TTFT/TPOT: load = fitted against the requests in "
                                                       "flight (latency_model.py); ewma = recent average")
    admin_api_key: str | None = Field(default=None, min_length=1, description="when set, /metrics and /dashboard "
                                      "need it (Authorization: Bearer KEY, or HTTP Basic with it as password)")
    idle_cost_interval_s: float = Field(default=5.0, gt=0, description="how often pool time is written to the "
                                                                        "ledger (idle cost, utilization)")

    @model_validator(mode="after")
    def _references(self) -> FleetConfig:
        names = [p.name for p in self.pools]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"pools: names must be unique, {dup} repeat")
        for tname, t in self.tenants.items():
            if t.slo_class not in self.slo_classes:
                raise ValueError(f"tenants.{tname}.slo_class: {t.slo_class!r} is not one of "
                                 f"{sorted(self.slo_classes)}")
        groups: dict[str, list[str]] = {}
        for p in self.pools:
            if p.switch_group is not None:
                groups.setdefault(p.switch_group, []).append(p.name)
        lone = sorted(g for g, members in groups.items() if len(members) < 2)
        if lone:
            raise ValueError(f"pools: switch_group {lone} has a single pool; a group takes turns between 2 or more")
        keys = [t.api_key for t in self.tenants.values()]
        if len(set(keys)) != len(keys):
            raise ValueError("tenants: two tenants share an api_key")
        if self.admin_api_key is not None and self.admin_api_key in keys:
            raise ValueError("admin_api_key: must differ from every tenant's api_key")
        return self

    def models(self) -> list[str]:
        return sorted({m for p in self.pools for m in p.served_models})

    def tenant_by_key(self, api_key: str) -> tuple[str, Tenant] | None:
        for name, t in self.tenants.items():
            if t.api_key == api_key:
                return name, t
        return None


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: ANN201 - argparse's signature
        raise ValueError(message)


def replica_argv(engine: dict[str, Any]) -> list[str]:
    """`engine` ({flag: value}, snake_case) as `tokenmill serve` flags, checked by serve's own parser."""
    from tokenmill.server.cli_args import add_serve_args
    parser = add_serve_args(_RaisingParser(prog="engine", add_help=False))
    dests = {a.dest: a for a in parser._actions}
    argv: list[str] = []
    for key, value in engine.items():
        action = dests.get(key)
        if action is None or not action.option_strings:
            known = sorted(d for d, a in dests.items() if a.option_strings and d not in RESERVED_ENGINE_FLAGS)
            raise ValueError(f"{key}: not a `tokenmill serve` flag; known: {', '.join(known)}")
        flag = action.option_strings[-1]
        if isinstance(value, bool):
            if value:
                argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    try:
        parser.parse_args(["placeholder-model", *argv] if "model" in dests else argv)
    except ValueError as e:
        raise ValueError(str(e)) from None
    return argv


def load_fleet_config(path: str | Path) -> FleetConfig:
    """The file, validated; ValueError naming the file and every wrong field."""
    text = Path(path).read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    return parse_fleet_config(data, str(path))


def parse_fleet_config(data: Any, source: str = "fleet config") -> FleetConfig:
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as e:
        lines = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            lines.append(f"{where}: {msg}")
        raise ValueError(f"{source}: " + "; ".join(lines)) from None
