"""A replica of a `launcher: ray` pool: an engine actor on a Ray cluster (tokenmill/ray/).

Ray places it on a node with the pool's `ray.resources` and restarts it when it dies (up to
`ray.max_restarts`) on the same port, so the fleet keeps its URL: the replica is unhealthy while
its scrapes fail and healthy again at the first one that succeeds (replica.py). The actor is
started from the fleet's process, which joins the cluster (`ray_address`) first.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import httpx

from tokenmill.fleet.replica import Replica, free_port

logger = logging.getLogger(__name__)


@dataclass
class RayReplica(Replica):
    engine: object | None = None  # tokenmill.ray.launcher.RayEngine once started
    port: int = 0

    def __post_init__(self) -> None:
        first = self.pool.ray_placement.first_port
        self.port = first + self.index if first is not None else free_port()

    @property
    def url(self) -> str:
        return (self.engine.url if self.engine is not None and self.engine.url else
                f"http://127.0.0.1:{self.port}")

    def start(self) -> None:
        from tokenmill.ray.launcher import RayEngine, RayPlacement
        r = self.pool.ray_placement
        placement = RayPlacement(dict(r.resources), num_cpus=r.num_cpus, max_restarts=r.max_restarts)
        self.engine = RayEngine(self.name, self.engine_args(), self.port, placement, str(self.log_dir.resolve()))
        logger.info("replica %s: a Ray actor needing %s, port %d", self.name, r.resources or "no custom resource",
                    self.port)

    async def wait_ready(self, client: httpx.AsyncClient, timeout: float) -> None:
        """First the actor's URL (its node's address), then the engine's /health."""
        deadline = time.monotonic() + timeout
        while self.engine.url is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {self.name}: Ray did not start its actor within {timeout:.0f} s "
                                   f"(are there nodes with {self.pool.ray_placement.resources or 'free CPUs'}?)")
            await self.engine.info_async(timeout=max(1.0, deadline - time.monotonic()))
        await super().wait_ready(client, max(1.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 15.0) -> None:
        if self.engine is not None:
            self.engine.stop()
        self.healthy = False
