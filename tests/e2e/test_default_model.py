"""The real default model (SmolLM2-135M-Instruct, its own chat template) through the `openai` client."""
from __future__ import annotations

import openai

MESSAGES = [{"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is the capital of France? Answer in one word."}]


def test_default_model_chat_with_openai_client(default_server):
    client = openai.OpenAI(base_url=default_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    models = client.models.list()
    assert [m.id for m in models.data] == ["SmolLM2-135M-Instruct"]
    model_folder = models.data[0].model_extra["root"]

    r = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MESSAGES, max_tokens=8,
                                       temperature=0)
    answer = r.choices[0].message.content
    assert "Paris" in answer, answer
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_folder)
    ids = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert r.usage.prompt_tokens == len(ids)
    assert 1 <= r.usage.completion_tokens <= 8 and r.choices[0].finish_reason in ("stop", "length")

    stream = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=MESSAGES, max_tokens=8,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
