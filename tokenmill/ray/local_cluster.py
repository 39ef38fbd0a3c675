"""A Ray cluster of logical nodes on this machine, for tests and benchmarks: each node a raylet
with its own CPUs and a custom resource naming it, everything on 127.0.0.1, no dashboard, small
object stores. Use as a context manager; it leaves nothing running."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def local_ray_cluster(node_resources: list[str], num_cpus: float = 1, object_store_mb: int = 100) -> Iterator:
    from tokenmill.ray.launcher import import_ray
    ray = import_ray()
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster
    # Ray turns a loopback bootstrap address into the machine's address; keep everything on loopback
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "UCX_NET_DEVICES": "lo"}  # and NIXL's UCX listens on loopback only (the nodes inherit this)
    saved_env = {k: os.environ.get(k) for k in env}
    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update(env)
    ray_constants.ENABLE_RAY_CLUSTER = False
    node = dict(num_cpus=num_cpus, object_store_memory=object_store_mb * 2**20, node_ip_address="127.0.0.1",
                include_dashboard=False)
    cluster = Cluster(initialize_head=True, head_node_args=dict(node, resources={node_resources[0]: 1}))
    try:
        for name in node_resources[1:]:
            cluster.add_node(**node, resources={name: 1})
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
