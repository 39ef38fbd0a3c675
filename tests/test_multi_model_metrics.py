"""serve-multi's /metrics: the expositions of several engines (their own registries, told apart by
model_name) merged into one that Prometheus' parser reads with every sample kept."""
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tokenmill.server.multi_model import merge_expositions


def _engine(name: str, busy: float) -> str:
    reg = CollectorRegistry()
    Counter("tokenmill:engine_busy_seconds", "busy", ["model_name"], registry=reg).labels(name).inc(busy)
    Gauge("tokenmill:kv_cache_usage_perc", "kv", ["model_name"], registry=reg).labels(name).set(0.5)
    return generate_latest(reg).decode()


def test_merged_exposition_keeps_every_sample_once_per_family():
    text = merge_expositions([_engine("a", 1.0), _engine("b", 2.5)])
    families = {f.name: f for f in text_string_to_metric_families(text)}
    busy = {s.labels["model_name"]: s.value for s in families["tokenmill:engine_busy_seconds"].samples
            if s.name.endswith("_total")}
    assert busy == {"a": 1.0, "b": 2.5}
    assert text.count("# TYPE tokenmill:kv_cache_usage_perc ") == 1
