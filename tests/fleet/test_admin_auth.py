"""The fleet's admin key: with `admin_api_key` set, /metrics and /dashboard* answer 401 without it
(tenant keys do not open them), and open with it as a Bearer token or a Basic password; without
the field they stay open. The app runs in process, its replicas never started."""
from __future__ import annotations

import base64

import pytest
from fastapi.testclient import TestClient

from tokenmill.fleet.app import build_fleet_app
from tokenmill.fleet.config import parse_fleet_config
from tokenmill.fleet.runtime import FleetRuntime

ADMIN_PATHS = ("/metrics", "/dashboard", "/dashboard/data", "/dashboard/charts.js")


def _client(tmp_path, **extra) -> TestClient:
    config = parse_fleet_config({
        "pools": [{"name": "p", "model": "m", "hardware": {"name": "cpu", "price_per_hour": 1.0}}],
        "slo_classes": {"batch": {}}, "tenants": {"acme": {"api_key": "TENANT", "slo_class": "batch"}},
        "ledger": str(tmp_path / "ledger.sqlite"), **extra})
    return TestClient(build_fleet_app(FleetRuntime(config, tmp_path / "logs"), start_replicas=False))


def _basic(password: str) -> str:
    return "Basic " + base64.b64encode(f"admin:{password}".encode()).decode()


def test_admin_key_guards_metrics_and_dashboard(tmp_path):
    with _client(tmp_path, admin_api_key="ADMIN") as c:
        for path in ADMIN_PATHS:
            for auth in (None, "Bearer TENANT", "Bearer wrong", _basic("wrong"), "Basic !!notbase64"):
                r = c.get(path, headers={"Authorization": auth} if auth else {})
                assert r.status_code == 401, (path, auth)
                assert r.headers["www-authenticate"].startswith("Basic")
            assert c.get(path, headers={"Authorization": "Bearer ADMIN"}).status_code == 200, path
            assert c.get(path, headers={"Authorization": _basic("ADMIN")}).status_code == 200, path
        assert "tokenmill:fleet_" in c.get("/metrics", headers={"Authorization": "Bearer ADMIN"}).text
        # tenants' routes still take tenant keys, not the admin's
        assert c.get("/v1/models", headers={"Authorization": "Bearer TENANT"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer ADMIN"}).status_code == 401


def test_without_admin_key_they_stay_open(tmp_path):
    with _client(tmp_path) as c:
        for path in ADMIN_PATHS:
            assert c.get(path).status_code == 200, path


def test_admin_key_must_differ_from_tenant_keys(tmp_path):
    with pytest.raises(ValueError, match="admin_api_key"):
        _client(tmp_path, admin_api_key="TENANT")
