"""echo + logprobs on /v1/completions (OpenAI's legacy semantics, how lm-eval-style clients compute
perplexity) and vLLM's prompt_logprobs field, through the official `openai` client on a live tiny
server; logprobs checked against transformers' teacher-forced log-softmax (float32, 1e-4)."""
from __future__ import annotations

import openai
import pytest
import torch
import transformers

MODEL = "tiny"
PROMPT = "The quick brown fox jumps over the lazy dog. Paris is the capital of France."
TOL = 1e-4


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(tiny_llama, tiny_tokenizer):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    ids = tiny_tokenizer.encode(PROMPT, add_special_tokens=True)
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([ids])).logits[0], dim=-1)
    return ids, [lp[i - 1, ids[i]].item() for i in range(1, len(ids))]


def test_echo_max_tokens_0_is_the_prompt_and_its_logprobs(client, reference):
    ids, ref = reference
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2)
    c = r.choices[0]
    assert c.text == PROMPT and c.finish_reason == "length"
    lp = c.logprobs
    assert len(lp.tokens) == len(ids) and "".join(lp.tokens) == PROMPT
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:], ref)) < TOL
    assert all(len(t) in (2, 3) for t in lp.top_logprobs[1:])  # top-2, plus the prompt token when outside it
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(ids))]
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0
    # token ids as the prompt (how lm-eval's local-completions sends it): the same numbers
    r2 = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=0)
    assert r2.choices[0].text == PROMPT
    assert r2.choices[0].logprobs.token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-6)


def test_echo_with_generation_stream_equals_non_stream(client, reference):
    ids, ref = reference
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=5, echo=True, logprobs=1, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0]
    assert full.text.startswith(PROMPT) and len(full.text) > len(PROMPT)
    lp = full.logprobs
    assert len(lp.tokens) == len(ids) + 5 and lp.token_logprobs[0] is None
    assert max(abs(a - b) for a, b in zip(lp.token_logprobs[1:len(ids)], ref)) < TOL
    plain = client.completions.create(**{**kw, "echo": False}).choices[0]
    assert full.text == PROMPT + plain.text
    assert lp.token_logprobs[len(ids):] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-6)
    chunks = list(client.completions.create(**kw, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == full.text
    streamed = [v for ch in chunks if ch.choices[0].logprobs for v in ch.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-6)
    offsets = [o for ch in chunks if ch.choices[0].logprobs for o in ch.choices[0].logprobs.text_offset]
    # offsets count the tokens' texts, streamed or not (the streamed text can lag them)
    assert offsets == lp.text_offset


def test_streamed_text_offset_with_a_stop_string_equals_non_stream(client):
    """A possible stop string holds streamed text back; the offsets must not follow the held text."""
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=12, logprobs=1, temperature=0, extra_body={"ignore_eos": True})
    plain = client.completions.create(**kw).choices[0]
    stop = plain.logprobs.tokens[6].strip() or plain.logprobs.tokens[6]
    full = client.completions.create(**kw, stop=[stop]).choices[0]
    chunks = list(client.completions.create(**kw, stop=[stop], stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == full.text
    offsets = [o for ch in chunks if ch.choices[0].logprobs for o in ch.choices[0].logprobs.text_offset]
    assert offsets == full.logprobs.text_offset


def test_prompt_logprobs_field_on_both_endpoints(client, reference, tiny_tokenizer):
    ids, ref = reference
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 1})
    plp = r.model_dump()["choices"][0]["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    for i in range(1, len(ids)):
        entry = plp[i][str(ids[i])]
        assert abs(entry["logprob"] - ref[i - 1]) < TOL and entry["rank"] >= 1
        assert any(e["rank"] == 1 for e in plp[i].values())
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hello world"}],
                                          max_tokens=1, extra_body={"prompt_logprobs": 0})
    cplp = chat.model_dump()["prompt_logprobs"]
    chat_ids = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "Hello world"}],
                                                  add_generation_prompt=True, tokenize=True)
    chat_ids = chat_ids["input_ids"] if isinstance(chat_ids, dict) or hasattr(chat_ids, "input_ids") else chat_ids
    assert cplp[0] is None and len(cplp) == len(chat_ids)
    assert all(list(e) == [str(t)] for e, t in zip(cplp[1:], chat_ids[1:]))


@pytest.mark.parametrize("kwargs,param", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=2, stream=True, extra_body={"prompt_logprobs": 1}), "prompt_logprobs"),
    (dict(max_tokens=2, extra_body={"prompt_logprobs": 21}), "prompt_logprobs"),
    (dict(max_tokens=2, extra_body={"prompt_logprobs": -1}), "prompt_logprobs"),
])
def test_bad_requests_name_the_field(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=PROMPT, **kwargs)
    assert e.value.body["param"] == param
