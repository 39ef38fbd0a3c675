"""The KV connector's worker half by name (`--kv-connector`)."""
from __future__ import annotations


def make_connector_worker(name: str, role: str, kv_caches: list, num_blocks: int):
    if name == "shm":
        from tokenmill.disagg.shm_worker import ShmConnectorWorker
        return ShmConnectorWorker(role, kv_caches, num_blocks)
    if name == "nixl":
        from tokenmill.disagg.nixl_worker import NixlConnectorWorker
        return NixlConnectorWorker(role, kv_caches, num_blocks)
    raise ValueError(f"kv_connector must be one of shm, nixl; got {name!r}")
