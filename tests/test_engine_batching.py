"""Continuous batching, chunked prefill and preemption must not change greedy outputs."""
import random

import pytest

from tokenmill import LLM, SamplingParams
from tokenmill.engine.engine import LLMEngine

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def _prompts(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(3, 500) for _ in range(rng.randint(1, 60))]} for _ in range(n)]


def _generate(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def prompts():
    return _prompts(32)


@pytest.fixture(scope="module")
def alone(tiny_llm, prompts):
    return [_generate(tiny_llm, [p])[0] for p in prompts]


def test_batch_of_32_equals_alone(tiny_llm, prompts, alone):
    assert _generate(tiny_llm, prompts) == alone


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_sizes(tiny_llama, prompts, alone, chunk):
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.02, max_num_batched_tokens=chunk,
              max_num_seqs=32, enable_prefix_caching=False)
    subset = slice(0, 6) if chunk == 1 else slice(None)
    assert _generate(llm, prompts[subset]) == alone[subset]


def test_small_cache_forces_preemption_outputs_identical(tiny_llama, prompts, alone):
    # 24 blocks of 4 tokens: far less than 32 requests need at once
    llm = LLM(str(tiny_llama), dtype="float32", block_size=4, num_kv_blocks=24,
              enable_prefix_caching=False)
    engine = llm.llm_engine
    assert engine.config.cache.num_blocks == 24
    assert _generate(llm, prompts) == alone
    assert engine.core.scheduler.num_preemptions > 0
    assert engine.core.kv.pool.num_free_blocks == engine.config.cache.num_blocks  # nothing leaked


def test_seeded_sampling_reproducible_across_batches(tiny_llm, prompts):
    p = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    alone = _generate(tiny_llm, [prompts[3]], p)[0]
    unseeded = SamplingParams(max_tokens=10, temperature=1.0, ignore_eos=True)
    mixed = tiny_llm.generate(prompts[:3] + [prompts[3]] + prompts[4:10],
                              [unseeded] * 3 + [p] + [unseeded] * 6, use_tqdm=False)
    assert mixed[3].outputs[0].token_ids == alone
    other_seed = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, top_k=50, seed=99, ignore_eos=True)
    assert _generate(tiny_llm, [prompts[3]], other_seed)[0] != alone


def test_n_samples_and_logprobs(tiny_llm):
    p = SamplingParams(n=3, max_tokens=6, temperature=1.0, seed=5, logprobs=3, ignore_eos=True)
    out = tiny_llm.generate([{"prompt_token_ids": [5, 6, 7]}], p, use_tqdm=False)[0]
    assert [o.index for o in out.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    for o in out.outputs:
        assert len(o.logprobs) == 6
        for tok, lp in zip(o.token_ids, o.logprobs):
            assert tok in lp and len(lp) >= 3
            assert lp[tok].logprob <= 0
        assert o.cumulative_logprob == pytest.approx(sum(lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)))


def test_greedy_logprobs_are_top1(tiny_llm):
    out = tiny_llm.generate([{"prompt_token_ids": [9, 10, 11]}],
                            SamplingParams(max_tokens=5, temperature=0, logprobs=2, ignore_eos=True),
                            use_tqdm=False)[0].outputs[0]
    for tok, lp in zip(out.token_ids, out.logprobs):
        assert lp[tok].rank == 1


def test_max_tokens_and_finish_reasons(tiny_llm):
    out = tiny_llm.generate([{"prompt_token_ids": [1, 2, 3]}], SamplingParams(max_tokens=4, temperature=0,
                                                                              ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4 and out[0].outputs[0].finish_reason == "length"


def test_stop_token_ids(tiny_llm, alone, prompts):
    stop_tok = alone[0][4]
    out = tiny_llm.generate([prompts[0]], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                                                         stop_token_ids=[stop_tok]), use_tqdm=False)[0]
    first = alone[0].index(stop_tok)
    assert out.outputs[0].token_ids == alone[0][:first + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop_tok


def test_bad_requests_fail_alone(tiny_llama, caplog, monkeypatch):
    """vLLM raises for the batch; LLM answers the valid prompts and logs each refusal."""
    import logging
    monkeypatch.setattr(logging.getLogger("tokenmill"), "propagate", True)
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.02, max_model_len=64)
    with caplog.at_level(logging.WARNING, logger="tokenmill.llm"):
        outs = llm.generate([{"prompt_token_ids": list(range(3, 80))}, {"prompt_token_ids": [5, 6]},
                             {"prompt_token_ids": []}], SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
    assert "prompt 0 is refused" in caplog.text and "prompt 2 is refused" in caplog.text
    assert "maximum context length is 64 tokens" in outs[0].error and outs[0].outputs[0].finish_reason == "error"
    assert len(outs[1].outputs[0].token_ids) >= 1 and outs[1].error is None
    assert "must not be empty" in outs[2].error


def test_request_larger_than_whole_cache_errors_at_once(tiny_llama):
    engine = LLMEngine(model=str(tiny_llama), dtype="float32", block_size=4, num_kv_blocks=8)
    with pytest.raises(ValueError, match="whole cache holds 32"):
        engine.add_request("x", {"prompt_token_ids": list(range(3, 30))}, SamplingParams(max_tokens=10))
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("field,value,allowed", [
    ("temperature", -1, r"\[0, 100\]"), ("top_p", 0.0, r"\(0, 1\]"), ("top_k", -5, "-1, 0"),
    ("max_tokens", 0, "an integer >= 1"), ("n", 0, "an integer >= 1"), ("min_p", 2.0, r"\[0, 1\]"),
    ("presence_penalty", 3.0, r"\[-2, 2\]"), ("logprobs", 50, "0..20"), ("stop", [""], "non-empty"),
])
def test_invalid_sampling_params_name_the_field(field, value, allowed):
    with pytest.raises(ValueError, match=rf"{field} must be {allowed}"):
        SamplingParams(**{field: value})


def test_abort_frees_blocks(tiny_llm):
    engine = tiny_llm.llm_engine
    rid = engine.add_request(None, {"prompt_token_ids": list(range(3, 40))}, SamplingParams(max_tokens=50))
    engine.step()
    assert engine.core.kv.pool.num_used_blocks > 0
    engine.abort_request(rid)
    assert engine.core.kv.pool.num_used_blocks == 0 and not engine.has_unfinished_requests()


def test_logprobs_rank_of_a_sampled_token_outside_the_top_k(tiny_llm):
    """As vLLM: the sampled token's entry carries its rank (1 + tokens more likely) even when it is
    not among the top-k alternatives; the alternatives are ranked 1..k."""
    p = SamplingParams(max_tokens=24, temperature=5.0, seed=3, logprobs=1, ignore_eos=True)
    out = tiny_llm.generate([{"prompt_token_ids": [5, 6, 7]}], p, use_tqdm=False)[0].outputs[0]
    outside = [(t, lp) for t, lp in zip(out.token_ids, out.logprobs) if lp[t].rank != 1]
    assert outside, "temperature 5 should sample some non-top-1 tokens"
    for tok, lp in outside:
        top = [x for t, x in lp.items() if t != tok]
        assert len(top) == 1 and top[0].rank == 1 and lp[tok].rank > 1
        assert lp[tok].logprob <= top[0].logprob and lp[tok].decoded_token is not None


def test_bad_prompt_type_fails_the_batch_and_queues_nothing(tiny_llm):
    engine = tiny_llm.llm_engine
    with pytest.raises(TypeError, match=r"prompts\[2\] must be a string"):
        tiny_llm.generate(["hello", {"prompt_token_ids": [4, 5]}, 3.5], SamplingParams(max_tokens=2))
    with pytest.raises(TypeError, match=r"sampling_params\[1\] must be a SamplingParams"):
        tiny_llm.generate(["a", "b"], [SamplingParams(), {"max_tokens": 2}])
    assert not engine.has_unfinished_requests() and engine.core.kv.pool.num_used_blocks == 0


def test_max_tokens_beyond_the_context_ends_at_the_context(tiny_llama):
    """LLM as vLLM offline: an output whose max_tokens passes max_model_len stops there ("length");
    max_tokens=None takes the room that is left. The engine the server uses refuses such a
    request instead, as the OpenAI API (tests/e2e/test_openai_api.py)."""
    llm = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.02, max_model_len=64)
    prompt = [{"prompt_token_ids": list(range(3, 43))}]
    for max_tokens in (30, None):
        out = llm.generate(prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                           use_tqdm=False)[0]
        assert out.error is None and len(out.outputs[0].token_ids) == 24 and out.outputs[0].finish_reason == "length"
    engine = llm.llm_engine
    engine.clamp_max_tokens = False
    with pytest.raises(ValueError, match="However, you requested 70 tokens"):
        engine.add_request(None, prompt[0], SamplingParams(max_tokens=30))
    assert not engine.has_unfinished_requests()


def test_bfloat16_chunking_and_preemption_outputs_identical(tiny_llama, prompts):
    """bfloat16 (bf16 KV cache; on AVX512_BF16 CPUs prompt rows attend with bf16 products, generated
    rows with float32 math): 7-token chunks, and a cache small enough to preempt (recompute chunks
    run past the prompt), give the same greedy tokens as each prompt alone. Where such a chunk is
    split is checked in tests/test_attention_backends.py."""
    subset = prompts[:12]
    alone_llm = LLM(str(tiny_llama), dtype="bfloat16", num_kv_blocks=256, block_size=4, enable_prefix_caching=False)
    alone = [_generate(alone_llm, [p])[0] for p in subset]
    chunked = LLM(str(tiny_llama), dtype="bfloat16", num_kv_blocks=256, block_size=4, max_num_batched_tokens=7,
                  max_num_seqs=12, enable_prefix_caching=False)
    assert _generate(chunked, subset) == alone
    small = LLM(str(tiny_llama), dtype="bfloat16", block_size=4, num_kv_blocks=24, enable_prefix_caching=False)
    assert _generate(small, subset) == alone
    assert small.llm_engine.core.scheduler.num_preemptions > 0
