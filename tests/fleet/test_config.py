"""The fleet file: the issue's shape loads; every wrong field is an error naming it."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tokenmill.fleet.config import load_fleet_config, parse_fleet_config

ISSUE_EXAMPLE = """
pools:
  - {name: premium, model: default, replicas: 1, hardware: {name: h100-class, price_per_hour: 4.0, cores: [0]}}
  - {name: economy, model: default, replicas: 1, hardware: {name: cpu-class, price_per_hour: 0.5, cores: [1]}}
slo_classes:
  interactive: {ttft_ms: 1500, tpot_ms: 250}
  batch: {}
tenants:
  acme: {api_key: KEY_A, slo_class: interactive}
  globex: {api_key: KEY_B, slo_class: batch}
"""


def _example():
    data = yaml.safe_load(ISSUE_EXAMPLE)
    for p in data["pools"]:  # this machine may have one core
        p["hardware"]["cores"] = [0]
    return data


def test_the_issue_example_loads(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(ISSUE_EXAMPLE.replace("cores: [1]", "cores: [0]"))
    cfg = load_fleet_config(path)
    assert [p.name for p in cfg.pools] == ["premium", "economy"] and cfg.models() == ["default"]
    assert cfg.pools[0].model_path is None  # 'default': the built-in model
    assert cfg.slo_classes["batch"].best_effort and not cfg.slo_classes["interactive"].best_effort
    assert cfg.tenant_by_key("KEY_B")[0] == "globex" and cfg.tenant_by_key("nope") is None


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["pools"][1]["hardware"].update(price_per_hour=-1), "pools.1.hardware.price_per_hour"),
    (lambda d: d["pools"][0].update(replica=2), "pools.0.replica: unknown field"),
    (lambda d: d["pools"][0]["hardware"].update(cores=[4096]), "pools.0.hardware.cores: Value error, cores [4096]"),
    (lambda d: d["pools"][0].update(engine={"dtyp": "float32"}), "pools.0.engine: dtyp: not a `tokenmill serve` flag"),
    (lambda d: d["pools"][0].update(engine={"dtype": "float33"}), "invalid choice: 'float33'"),
    (lambda d: d["pools"][0].update(engine={"port": 1}), "['port'] are set by the fleet"),
    (lambda d: d["tenants"]["acme"].update(slo_class="gold"), "tenants.acme.slo_class: 'gold' is not one of"),
    (lambda d: d["slo_classes"]["interactive"].update(ttft_ms=0), "slo_classes.interactive.ttft_ms"),
    (lambda d: d["pools"][1].update(name="premium"), "names must be unique, ['premium'] repeat"),
    (lambda d: d.pop("tenants"), "tenants: Field required"),
    (lambda d: d["pools"][0].update(launcher="slurm"), "pools.0.launcher: Input should be 'process' or 'ray'"),
    (lambda d: d["pools"][0].update(launcher="ray"), "pools.0: hardware.cores: a `launcher: ray` pool is placed by Ray"),
    (lambda d: d["pools"][0].update(ray={"num_cpus": 1}), "pools.0: ray: only for `launcher: ray` pools"),
    (lambda d: (d["pools"][0]["hardware"].pop("cores"), d["pools"][0].update(launcher="ray", ray={"num_cpu": 1})),
     "pools.0.ray.num_cpu: unknown field"),
])
def test_a_wrong_field_is_named(edit, expected):
    data = _example()
    edit(data)
    with pytest.raises(ValueError) as e:
        parse_fleet_config(data, "fleet.yaml")
    assert expected.replace("Value error, ", "") in str(e.value) and str(e.value).startswith("fleet.yaml: ")


def test_a_ray_pool_needs_no_cores():
    data = _example()
    data["pools"][1]["hardware"].pop("cores")
    data["pools"][1].update(launcher="ray", ray={"resources": {"node_b": 0.01}, "num_cpus": 2, "first_port": 9100})
    pool = parse_fleet_config(data).pools[1]
    assert pool.launcher == "ray" and pool.ray_placement.resources == {"node_b": 0.01}
    from tokenmill.fleet.ray_replica import RayReplica
    from tokenmill.fleet.replica import make_replica
    replica = make_replica(pool, 1, Path("/nonexistent"))  # not started: nothing needs Ray yet
    assert isinstance(replica, RayReplica) and replica.port == 9101
    assert replica.engine_args()[replica.engine_args().index("--num-threads") + 1] == "2"


def test_the_command_says_it_in_one_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(ISSUE_EXAMPLE.replace("price_per_hour: 0.5", "price_per_hour: cheap"))
    r = subprocess.run([sys.executable, "-m", "tokenmill", "fleet", "--config", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "pools.1.hardware.price_per_hour" in r.stderr and "Traceback" not in r.stderr


def test_models_pool_shape_and_errors():
    data = _example()
    data["pools"][1] = {"name": "shared", "hardware": {"name": "cpu", "price_per_hour": 1.0},
                        "engine": {"dtype": "float32"},
                        "models": [{"model": "a", "path": "/m/a"}, {"model": "b", "engine": {"max_model_len": 256}}]}
    cfg = parse_fleet_config(data)
    shared = cfg.pools[1]
    assert shared.served_models == ["a", "b"] and shared.model_label == "a+b" and cfg.models() == ["a", "b", "default"]
    from tokenmill.fleet.replica import ReplicaProcess
    replica = ReplicaProcess(shared, 0, Path("/tmp"))
    argv = replica.argv()
    assert argv[2] == "tokenmill.server.multi_launch"
    specs = [argv[i + 1] for i, a in enumerate(argv) if a == "--model"]
    assert specs == ["a=/m/a --dtype float32", "b=b --dtype float32 --max-model-len 256"]
    bad = [({"model": "x"}, "model, models: give exactly one"),
           ({"models": [{"model": "a"}, {"model": "a"}]}, "names must be unique"),
           ({"models": [{"model": "a"}]}, "models: List should have at least 2"),
           ({"models": [{"model": "a"}, {"model": "b", "engine": {"port": 1}}]}, "models.1.engine"),
           ({"models": [{"model": "a"}, {"model": "b"}], "switch_group": "g"}, "switch_group")]
    for extra, message in bad:
        data["pools"][1] = {**data["pools"][1], **extra}
        if "model" not in extra:
            data["pools"][1].pop("model", None)
        with pytest.raises(ValueError, match=message):
            parse_fleet_config(data)
        data["pools"][1] = {"name": "shared", "hardware": {"name": "cpu", "price_per_hour": 1.0},
                            "models": [{"model": "a"}, {"model": "b"}]}
