"""A fleet pool with `models:` (option (c), one engine process holding several models, one awake
at a time) live: the fleet routes both models to it, each answer equals that model served alone
(greedy, the offline LLM as the reference), and the ledger bills each request under its own model."""
from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import openai
import pytest

from e2e_helpers import TINY_CHAT_TEMPLATE
from fleet_helpers import TENANTS, run_fleet
from tiny_models import make_tiny_model

PROMPTS = ["The quick brown fox", "Paris is the capital", "one two three"]
ENGINE = {"dtype": "float32", "kv_cache_memory_gb": 0.02, "disable_log_stats": True}


@pytest.fixture(scope="module")
def multi_fleet(tiny_llama, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multi_fleet")
    beta = make_tiny_model(tmp / "beta", "llama", seed=7)
    config = {
        "pools": [{"name": "shared", "max_concurrency": 4, "switch_quantum_s": 0.05,
                   "hardware": {"name": "cpu", "price_per_hour": 1.0}, "engine": ENGINE,
                   "models": [{"model": "alpha", "path": str(tiny_llama),
                               "engine": {"chat_template": TINY_CHAT_TEMPLATE}},
                              {"model": "beta", "path": str(beta)}]}],
        "slo_classes": {"interactive": {"ttft_ms": 60000}, "standard": {}, "batch": {}},
        "tenants": {name: {"api_key": key, "slo_class": cls} for name, (key, cls) in TENANTS.items()},
        "ledger": str(tmp / "ledger.sqlite"), "idle_cost_interval_s": 1.0,
    }
    for fleet in run_fleet(config, tmp):
        yield fleet, {"alpha": tiny_llama, "beta": beta}


def _reference(folder: Path) -> list[str]:
    from tokenmill import LLM, SamplingParams
    llm = LLM(str(folder), dtype="float32", kv_cache_memory_gb=0.02)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def test_models_pool_serves_both_models_as_each_alone(multi_fleet):
    fleet, folders = multi_fleet
    expected = {name: _reference(folder) for name, folder in folders.items()}

    async def traffic():
        async with openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key=fleet.key("acme"), max_retries=0) as c:
            async def one(model, i):
                r = await c.completions.create(model=model, prompt=PROMPTS[i], max_tokens=6, temperature=0,
                                               extra_body={"ignore_eos": True})
                return model, i, r.choices[0].text
            return await asyncio.gather(*(one(m, i) for i in range(len(PROMPTS)) for m in ("beta", "alpha")))

    for model, i, text in asyncio.run(traffic()):
        assert text == expected[model][i], (model, i)
    data = fleet.data()
    assert data["pools"][0]["model"] == "alpha+beta"
    with sqlite3.connect(f"file:{fleet.ledger}?mode=ro", uri=True) as conn:
        rows = dict(conn.execute("SELECT model, COUNT(*) FROM requests WHERE pool = 'shared' "
                                 "AND prefill_device_seconds > 0 GROUP BY model").fetchall())
    assert rows == {"alpha": 3, "beta": 3}
