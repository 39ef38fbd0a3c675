"""Starting engine actors on a Ray cluster: where each goes (`RayPlacement`), how the driver joins
the cluster (`connect`), and the driver's handle on one engine (`RayEngine`).

Placement is Ray's own: an engine's actor asks for `num_cpus` and for the custom resources that
name the node(s) it may run on (`ray start --resources '{"node_b": 1}'` on that node; an engine
asks for a sliver of it, e.g. {"node_b": 0.01}), or for one node by id (a hard
NodeAffinitySchedulingStrategy). Restarts are Ray's own too: `max_restarts` (-1: always).
"""
from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field
from typing import Any

RAY_HINT = "pip install 'tokenmill[ray]'"


def import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError(f"the ray launcher needs Ray: {RAY_HINT}") from None
    return ray


def connect(address: str | None = None) -> None:
    """Join the Ray cluster at `address` (default: RAY_ADDRESS or a local `ray start` head) unless
    this process already has."""
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=address or "auto", log_to_driver=False)


@functools.cache
def _engine_actor_class():
    """EngineActor as a Ray actor class, made once per process (Ray exports it to the cluster once)."""
    from tokenmill.ray.engine_actor import EngineActor
    return import_ray().remote(EngineActor)


@dataclass(frozen=True)
class RayPlacement:
    resources: dict[str, float] = field(default_factory=dict)  # custom resources the actor needs
    node_id: str | None = None  # or exactly this node (hex id)
    num_cpus: float = 1.0
    max_restarts: int = 3  # -1: restart forever

    def actor_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "max_restarts": self.max_restarts,
                                "max_task_retries": 0, "resources": dict(self.resources)}
        if self.node_id is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node_id, soft=False)
        return opts

    def threads(self) -> int:
        return max(1, int(self.num_cpus))


class RayEngine:
    """One engine actor, seen from the driver: started at once, its URL known once it answers."""

    def __init__(self, name: str, engine_args: list[str], port: int, placement: RayPlacement,
                 log_dir: str | None = None) -> None:
        if "--num-threads" not in engine_args:
            engine_args = [*engine_args, "--num-threads", str(placement.threads())]
        self.name = name
        self.port = port
        self.actor = _engine_actor_class().options(**placement.actor_options()).remote(
            name, engine_args, port, log_dir)
        self.url: str | None = None

    def info(self, timeout: float = 30.0) -> dict | None:
        """The actor's report (url, engine pid, node, restarted), or None while it is down or restarting."""
        ray = import_ray()
        try:
            out = ray.get(self.actor.info.remote(), timeout=timeout)
        except (ray.exceptions.RayError, TimeoutError):
            return None
        self.url = out["url"]
        return out

    async def info_async(self, timeout: float = 30.0) -> dict | None:
        ray = import_ray()
        try:
            out = await asyncio.wait_for(asyncio.wrap_future(self.actor.info.remote().future()), timeout)
        except (ray.exceptions.RayError, asyncio.TimeoutError):
            return None
        self.url = out["url"]
        return out

    def wait_url(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.info(timeout=max(1.0, deadline - time.monotonic())) is not None:
                return self.url
            time.sleep(0.2)
        raise OSError(f"engine actor {self.name} did not start within {timeout:.0f} s")

    def stop(self) -> None:
        """End the engine on purpose (no restart), then the actor."""
        ray = import_ray()
        try:
            ray.get(self.actor.stop.remote(), timeout=30)
        except (ray.exceptions.RayError, TimeoutError):
            pass
        ray.kill(self.actor, no_restart=True)
