"""Code written for vLLM's offline API runs unchanged: its LLM arguments, its chat() arguments,
its SamplingParams normalisations and type checks."""
import logging

import pytest

from tokenmill import LLM, SamplingParams, StructuredOutputsParams

TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant:{% endif %}{% if shout %}!{% endif %}")


# -- SamplingParams ---------------------------------------------------------------------------------
def test_sampling_params_normalise_as_vllm():
    p = SamplingParams(stop="x", stop_token_ids=[5, 3, 5], seed=-1, logprobs=True, top_k=-1)
    assert (p.stop, p.stop_token_ids, p.seed, p.logprobs, p.top_k) == (["x"], [5, 3], None, 1, 0)
    assert SamplingParams().stop == [] and SamplingParams(logprobs=False).logprobs is None
    assert SamplingParams(seed=-7).seed == -7 and SamplingParams(repetition_penalty=20).repetition_penalty == 20


@pytest.mark.parametrize("kwargs, field", [
    ({"n": 2.0}, "n"), ({"top_k": 1.5}, "top_k"), ({"n": "2"}, "n"), ({"temperature": "0.5"}, "temperature"),
    ({"temperature": float("nan")}, "temperature"), ({"max_tokens": 3.0}, "max_tokens"),
    ({"min_tokens": True}, "min_tokens"), ({"stop_token_ids": [1.0]}, "stop_token_ids"),
    ({"seed": 2**63}, "seed"), ({"repetition_penalty": 0}, "repetition_penalty"),
])
def test_wrong_types_raise_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        SamplingParams(**kwargs)


def test_an_empty_json_schema_means_any_json():
    assert StructuredOutputsParams(json={}).kind == "json"
    assert StructuredOutputsParams(regex="a+", json_object=False).kind == "regex"
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json_object=False)


# -- LLM(...) ---------------------------------------------------------------------------------------
def test_vllm_constructor_arguments_are_accepted(tiny_llama, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("tokenmill"), "propagate", True)  # tokenmill's records reach caplog
    with caplog.at_level(logging.WARNING, logger="tokenmill.engine.vllm_args"):
        llm = LLM(str(tiny_llama), dtype="float32", tensor_parallel_size=1, gpu_memory_utilization=0.5,
                  trust_remote_code=False, enforce_eager=True, disable_log_stats=True, swap_space=4,
                  kv_cache_memory_bytes=2**24, max_logprobs=20, generation_config="vllm", chat_template=TEMPLATE)
    warned = caplog.text
    assert "gpu_memory_utilization" in warned and "enforce_eager" in warned  # non-default: named
    assert "trust_remote_code" not in warned and "swap_space" not in warned  # vLLM's defaults: silent
    assert llm.llm_engine.config.cache.num_blocks * llm.llm_engine.config.cache.bytes_per_token * 32 <= 2**24 * 1.01
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1"):
        LLM(str(tiny_llama), tensor_parallel_size=2)
    with pytest.raises(ValueError, match="generation_config must be one of auto, vllm"):
        LLM(str(tiny_llama), generation_config="/somewhere")


def test_chat_arguments(tiny_llama, tiny_llm):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.02, chat_template=TEMPLATE)
    tok = llm.get_tokenizer()
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}]
    plain = [{"role": "user", "content": "Hello there"}]
    a, b = llm.chat(parts, params, use_tqdm=False), llm.chat(plain, params, use_tqdm=False)
    assert a[0].prompt_token_ids == b[0].prompt_token_ids == tok.encode(
        "<s>user: Hello there</s><s>assistant:", add_special_tokens=False)
    shout = llm.chat(plain, params, use_tqdm=False, chat_template_kwargs={"shout": True})[0]
    assert tok.decode(shout.prompt_token_ids).endswith("assistant:!")
    cont = llm.chat(plain + [{"role": "assistant", "content": "Hi"}], params, use_tqdm=False,
                    continue_final_message=True)[0]
    assert "assistant: Hi" in tok.decode(cont.prompt_token_ids)
    assert not tok.decode(cont.prompt_token_ids).endswith("<s>assistant:")
    with pytest.raises(ValueError, match="only text parts"):
        llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], params)
    with pytest.raises(ValueError, match="lora_request"):
        llm.chat(plain, params, lora_request=object())


def test_prompt_types_and_multimodal_data(tiny_llm):
    from tokenmill.inputs import TextPrompt, TokensPrompt
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    a = tiny_llm.generate(TokensPrompt(prompt_token_ids=[5, 6, 7]), params, use_tqdm=False)[0]
    b = tiny_llm.generate([[5, 6, 7]], params, use_tqdm=False)[0]
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert tiny_llm.generate(TextPrompt(prompt="hello"), params, use_tqdm=False)[0].prompt == "hello"
    out = tiny_llm.generate({"prompt": "hi", "multi_modal_data": {"image": object()}}, params, use_tqdm=False)[0]
    assert "multi_modal_data" in out.error


# -- logit_bias and allowed_token_ids -----------------------------------------------------------------
def test_logit_bias_and_allowed_token_ids(tiny_llm):
    prompt = [[5, 6, 7, 8]]
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    free = tiny_llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
    pushed = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logit_bias={77: 100})
    assert tiny_llm.generate(prompt, pushed, use_tqdm=False)[0].outputs[0].token_ids == [77] * 6
    banned = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True, logit_bias={free[0]: -100})
    assert tiny_llm.generate(prompt, banned, use_tqdm=False)[0].outputs[0].token_ids != free[:1]
    allowed = [3, 40, 41, 300]
    for temperature in (0, 1.0):
        p = SamplingParams(max_tokens=12, temperature=temperature, ignore_eos=True, allowed_token_ids=allowed, seed=1)
        out = tiny_llm.generate(prompt * 3, p, use_tqdm=False)
        assert all(set(o.outputs[0].token_ids) <= set(allowed) for o in out)
    # a row without either, batched with them, is untouched
    mixed = tiny_llm.generate(prompt * 2, [greedy, pushed], use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == free
    with pytest.raises(ValueError, match="logit_bias must be"):
        SamplingParams(logit_bias={1: 101})
    with pytest.raises(ValueError, match="allowed_token_ids must be"):
        SamplingParams(allowed_token_ids=[])
    out = tiny_llm.generate(prompt, SamplingParams(allowed_token_ids=[10**6]), use_tqdm=False)[0]
    assert out.error.startswith("allowed_token_ids must be integers in [0,")


def test_logprob_entries_put_the_chosen_token_first(tiny_llm):
    p = SamplingParams(max_tokens=4, temperature=1.0, seed=3, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    out = tiny_llm.generate([[5, 6, 7, 8]], p, use_tqdm=False)[0]
    c = out.outputs[0]
    for token, entry in zip(c.token_ids, c.logprobs):
        assert next(iter(entry)) == token and len(entry) in (3, 4)
        others = [lp.rank for t, lp in entry.items() if t != token]  # the top 3 in rank order, less the chosen
        assert others == sorted(others) and set(others) | {entry[token].rank} >= {1, 2, 3}
    for token, entry in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
        assert next(iter(entry)) == token


def test_bad_words_are_never_generated(tiny_llm):
    """A word of one token and one of two (vLLM's rule: its last token is masked where the output
    ends with the rest), found in the free greedy output, are absent once banned."""
    tok = tiny_llm.get_tokenizer()
    prompts = [[5, 6, 7, 8], [40, 41, 42], [100, 7, 300, 9]]
    greedy = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    words = []
    for out in tiny_llm.generate(prompts, greedy, use_tqdm=False):
        ids = out.outputs[0].token_ids
        for n in (1, 2):  # a word whose own encoding is the tokens the model produced
            for j in range(len(ids) - n):
                word = tok.decode(ids[j:j + n])
                if word.strip() == word and word.isprintable() and tok.encode(word, add_special_tokens=False) \
                        == ids[j:j + n]:
                    words.append((out.prompt_token_ids, word, ids[j:j + n]))
                    break
    assert {len(seq) for _, _, seq in words} == {1, 2}
    for prompt, word, seq in words:
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, bad_words=[word])
        got = tiny_llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
        assert all(got[j:j + len(seq)] != seq for j in range(len(got))), (word, got)
    assert params.bad_words_token_ids is None  # the caller's params are left as they were
    with pytest.raises(ValueError, match="bad_words must be"):
        SamplingParams(bad_words=[" "])


def test_request_output_positional_order_is_vllms():
    """Code that builds outputs positionally (mocks, adapters) as vLLM's RequestOutput(request_id,
    prompt, prompt_token_ids, prompt_logprobs, outputs, finished)."""
    from tokenmill import CompletionOutput, RequestOutput
    out = RequestOutput("r", "hi", [1, 2], None, [CompletionOutput(0, "x", [3])], True)
    assert (out.prompt_logprobs, out.outputs[0].text, out.finished) == (None, "x", True)


def test_review_findings_caps_seeds_and_string_bad_words(tiny_llm):
    from tokenmill.sampling_params import MAX_BAD_WORDS, MAX_LOGIT_BIAS
    with pytest.raises(ValueError, match=f"bad_words must be at most {MAX_BAD_WORDS}"):
        SamplingParams(bad_words=[f"w{i}" for i in range(MAX_BAD_WORDS + 1)])
    with pytest.raises(ValueError, match=f"logit_bias must be a dict of at most {MAX_LOGIT_BIAS}"):
        SamplingParams(logit_bias={i: 1.0 for i in range(MAX_LOGIT_BIAS + 1)})
    assert SamplingParams(bad_words="damn").bad_words == ["damn"]
    assert SamplingParams(allowed_token_ids=[3, 3, 4]).allowed_token_ids == [3, 4]
    # n samples of a seeded request draw from seed + i, a sample whose seed is -1 included
    p = SamplingParams(n=3, seed=-2, max_tokens=6, temperature=1.0, ignore_eos=True)
    runs = [[c.token_ids for c in tiny_llm.generate([[5, 6, 7]], p, use_tqdm=False)[0].outputs] for _ in range(2)]
    assert runs[0] == runs[1]
