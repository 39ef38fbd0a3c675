"""Engines as Ray actors (extra tokenmill[ray]) on a local Ray cluster of two logical nodes, each
with one CPU and a custom resource naming it (node_a, node_b), everything on 127.0.0.1, no
dashboard, a 100 MiB object store per node; the cluster is shut down after the module.

- A prefill engine placed on node_a and a decode engine on node_b (`tokenmill cluster --launcher ray`'s
  launcher, from its command line)
  behind the router: a long prompt is handed over (NIXL when the extra is installed, else shared
  memory: both nodes are this machine) and the greedy tokens equal the colocated tiny `server`'s.
- A fleet pool with `launcher: ray` placed on node_b serves through the fleet endpoint, beside a
  local (process) pool.
- Killing an actor's engine process makes the actor exit, Ray restarts it on its node and port,
  and the router / the fleet serve again (same tokens); a local fleet replica whose process died
  is started again by the fleet."""
from __future__ import annotations

import os
import signal
import time

import httpx
import openai
import pytest
from e2e_helpers import TINY_ENGINE_ARGS, InProcessServer, listen_addresses, two_free_ports

ray = pytest.importorskip("ray")  # the test extra installs it: this skip is for bare installs only

from tokenmill.cli import build_parser  # noqa: E402
from tokenmill.disagg.launchers import RayLauncher, make_launcher, wait_healthy  # noqa: E402
from tokenmill.disagg.policy import RouterConfig  # noqa: E402
from tokenmill.disagg.router import Router, build_router_app  # noqa: E402
from tokenmill.fleet.app import build_fleet_app  # noqa: E402
from tokenmill.fleet.config import parse_fleet_config  # noqa: E402
from tokenmill.fleet.runtime import FleetRuntime  # noqa: E402
from tokenmill.ray.local_cluster import local_ray_cluster  # noqa: E402

try:
    from tokenmill.disagg.nixl_worker import import_nixl
    import_nixl()
    CONNECTOR = "nixl"
except ValueError:
    CONNECTOR = "shm"
PROMPT = [(7 * i) % 500 + 3 for i in range(150)]  # token ids: over the router's threshold (64)


@pytest.fixture(scope="module")
def ray_cluster():
    with local_ray_cluster(["node_a", "node_b"], num_cpus=1, object_store_mb=100) as cluster:
        yield cluster


def tokens(url: str, prompt: list[int], api_key: str = "x", max_tokens: int = 16, model: str = "tiny") -> list[int]:
    client = openai.OpenAI(base_url=url + "/v1", api_key=api_key, timeout=60, max_retries=0)
    out = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                    extra_body={"return_token_ids": True})
    return out.choices[0].token_ids


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def kill_engine_and_wait_restart(engine, timeout: float = 120.0) -> dict:
    """SIGKILL the actor's engine process; return the restarted actor's report."""
    before = engine.info()
    os.kill(before["pid"], signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        after = engine.info(timeout=5)
        if after is not None and after["pid"] != before["pid"]:
            assert after["restarted"] and after["node_id"] == before["node_id"] and after["url"] == before["url"]
            return after
        time.sleep(0.2)
    raise AssertionError(f"Ray did not restart {engine.name} within {timeout:.0f} s")


def wait_until(check, timeout: float = 60.0) -> None:
    """A replica still starting may accept a connection and not answer in time: not yet, not a failure."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_prefill_and_decode_actors_on_two_nodes(ray_cluster, tiny_llama, server, tmp_path):
    engine = [str(tiny_llama), *TINY_ENGINE_ARGS, "--served-model-name", "tiny", "--disable-log-stats",
              "--kv-connector", CONNECTOR]
    args = build_parser().parse_args([
        "cluster", "--launcher", "ray", "--ray-address", ray_cluster.address, "--ray-node-resources", "node_a",
        "node_b", "--ray-num-cpus", "0.5", "--first-engine-port", str(two_free_ports()), "--log-dir", str(tmp_path)])
    launcher = make_launcher(args)  # what `tokenmill cluster` uses; engine i goes to node RESOURCE[i]
    assert isinstance(launcher, RayLauncher)
    try:
        p_url = launcher.start(0, [*engine, "--role", "prefill"], [])
        d_url = launcher.start(1, [*engine, "--role", "decode"], [])
        p_eng, d_eng = launcher.engines
        nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes()}
        assert "node_a" in nodes[p_eng.info()["node_id"]] and "node_b" in nodes[d_eng.info()["node_id"]]
        launcher.wait_ready(timeout=240)
        for e in (p_eng, d_eng):  # the HTTP server and NIXL's UCX listener: loopback only
            assert listen_addresses(e.info()["pid"]) == {"127.0.0.1"}
        want = tokens(server.url, PROMPT)
        cfg = RouterConfig(min_remote_prefill_tokens=64)
        with InProcessServer(build_router_app(Router([p_url], [d_url], [], cfg, poll_interval_s=0.05))) as r:
            assert tokens(r.url, PROMPT) == want
            assert metric(d_url, "tokenmill:kv_transfer_bytes_count") == 1  # handed over, not recomputed
            assert metric(d_url, "tokenmill:kv_transfer_recomputes_total") == 0

            kill_engine_and_wait_restart(d_eng)
            wait_healthy(d_url, lambda: None, 120)
            state = lambda: httpx.get(r.url + "/router/state").json()  # noqa: E731
            wait_until(lambda: all(s["healthy"] for s in state()))
            prompt = [11, *PROMPT]  # a new prompt: the restarted decode engine's cache is empty
            assert tokens(r.url, prompt) == tokens(server.url, prompt)
            assert metric(d_url, "tokenmill:kv_transfer_bytes_count") == 1  # the new engine's first
    finally:
        launcher.stop()


def test_fleet_pool_of_ray_actors_beside_a_local_pool(ray_cluster, tiny_llama, server, tmp_path):
    """Both pools' replicas come back after their engine dies: Ray restarts the actor, the fleet
    starts the local process again."""
    engine = {"dtype": "float32", "kv_cache_memory_gb": 0.02, "disable_log_stats": True}
    config = parse_fleet_config({
        "pools": [{"name": "remote", "model": "tiny", "path": str(tiny_llama), "launcher": "ray",
                   "ray": {"resources": {"node_b": 0.01}, "num_cpus": 0.5, "max_restarts": 2},
                   "hardware": {"name": "ray-cpu", "price_per_hour": 1.0}, "engine": engine},
                  {"name": "local", "model": "tiny-local", "path": str(tiny_llama),
                   "hardware": {"name": "cpu", "price_per_hour": 1.0}, "engine": {**engine, "num_threads": 1}}],
        "slo_classes": {"standard": {"ttft_ms": 60000}},
        "tenants": {"acme": {"api_key": "KEY_A", "slo_class": "standard"}},
        "ledger": str(tmp_path / "ledger.sqlite"), "ray_address": ray_cluster.address})
    runtime = FleetRuntime(config, tmp_path / "replicas")
    remote, local = runtime.pools[0].replicas[0], runtime.pools[1].replicas[0]
    with InProcessServer(build_fleet_app(runtime), start_timeout=240) as fleet:
        info = remote.engine.info()
        assert "node_b" in {n["NodeID"]: n["Resources"] for n in ray.nodes()}[info["node_id"]]
        want = tokens(server.url, PROMPT)
        assert tokens(fleet.url, PROMPT, api_key="KEY_A") == want
        assert tokens(fleet.url, PROMPT, api_key="KEY_A", model="tiny-local") == want

        old_pid = local.proc.pid
        local.proc.kill()
        kill_engine_and_wait_restart(remote.engine)
        healthy = lambda: metric(fleet.url, "tokenmill:fleet_pool_replicas_healthy")  # noqa: E731
        wait_until(lambda: local.proc.pid != old_pid and healthy() == 2 and all(
            httpx.get(r.url + "/health", timeout=2).status_code == 200 for r in (remote, local)), timeout=120)
        assert tokens(fleet.url, PROMPT, api_key="KEY_A") == want
        assert tokens(fleet.url, PROMPT, api_key="KEY_A", model="tiny-local") == want
        assert metric(fleet.url, "tokenmill:fleet_requests_total") == 4
        assert metric(fleet.url, "tokenmill:fleet_replica_restarts_total") == 1  # the local one; Ray did the other
    assert not remote.healthy and not local.healthy
