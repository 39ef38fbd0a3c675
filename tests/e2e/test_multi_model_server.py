"""`tokenmill serve-multi`: one process holding two tiny models (different random weights), one
awake at a time. Through the official openai client, interleaved concurrent requests for both get
exactly what each model gives served alone (greedy, the offline LLM as the reference; same float32
path, so equal token for token); /v1/models lists both; /metrics counts the switches and merges
both engines' series; a sleeping model's request waits for its turn instead of failing."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e_helpers import REPO, ServerProcess
from tiny_models import make_tiny_model

PROMPTS = ["The quick brown fox", "Paris is the capital", "one two three", "Hello world, how"]
MAX_TOKENS = 8
ENGINE = "--dtype float32 --kv-cache-memory-gb 0.02"


class MultiServer(ServerProcess):
    def start(self) -> MultiServer:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "tokenmill", "serve-multi", *self.args, "--host",
                                      "127.0.0.1", "--port", str(self.port), "--disable-access-log"],
                                     cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        return self


@pytest.fixture(scope="module")
def two_models(tiny_llama, tmp_path_factory) -> dict[str, Path]:
    return {"alpha": tiny_llama, "beta": make_tiny_model(tmp_path_factory.mktemp("tiny_beta"), "llama", seed=7)}


def _reference(folder: Path) -> list[str]:
    from tokenmill import LLM, SamplingParams
    llm = LLM(str(folder), dtype="float32", kv_cache_memory_gb=0.02)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def _samples(text: str, name: str) -> dict[str, float]:
    return {s.labels.get("model_name", ""): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_one_process_two_models_switching_matches_each_alone(two_models, tmp_path):
    expected = {name: _reference(folder) for name, folder in two_models.items()}
    assert expected["alpha"] != expected["beta"]  # the models differ, so a mix-up would show
    args = [a for name, folder in two_models.items() for a in ("--model", f"{name}={folder} {ENGINE}")]
    server = MultiServer([*args, "--switch-quantum-s", "0.05"], "multi", tmp_path).start()
    try:
        server.wait_ready(180)

        async def traffic():
            async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as c:
                async def one(model: str, i: int) -> tuple[str, int, str]:
                    if i % 2:
                        stream = await c.completions.create(model=model, prompt=PROMPTS[i], max_tokens=MAX_TOKENS,
                                                            temperature=0, stream=True, extra_body={"ignore_eos": True})
                        text = "".join([ch.choices[0].text async for ch in stream if ch.choices])
                    else:
                        r = await c.completions.create(model=model, prompt=PROMPTS[i], max_tokens=MAX_TOKENS,
                                                       temperature=0, extra_body={"ignore_eos": True})
                        text = r.choices[0].text
                    return model, i, text
                jobs = [one(m, i) for _ in range(2) for i in range(len(PROMPTS)) for m in ("alpha", "beta")]
                return await asyncio.gather(*jobs)

        for _ in range(2):  # the second round starts on the model the first ended with: turns both ways
            for model, i, text in asyncio.run(traffic()):
                assert text == expected[model][i], (model, i)

        models = openai.OpenAI(base_url=server.url + "/v1", api_key="x").models.list()
        assert sorted(m.id for m in models.data) == ["alpha", "beta"]
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        switches = sum(_samples(metrics, "tokenmill:model_switches_total").values())
        assert switches >= 2
        assert sum(_samples(metrics, "tokenmill:model_awake").values()) == 1
        # both engines' series are there, one per model_name, in one valid exposition
        assert set(_samples(metrics, "tokenmill:engine_busy_seconds_total")) == {"alpha", "beta"}
        r = httpx.post(server.url + "/v1/completions", json={"model": "gamma", "prompt": "x"}, timeout=10)
        assert r.status_code == 404 and "alpha" in r.json()["error"]["message"]
    finally:
        server.stop()
