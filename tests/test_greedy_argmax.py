"""Plain greedy rows take their tokens straight from the LM head's argmax (LinearMethod.apply_argmax:
on AVX512_BF16 CPUs the logits never leave the registers). The tokens must be the ones the sampler
picks from the logits: a request asking for logprobs (which needs the logits) in the same engine gives
the same greedy tokens (tolerance 0: the fused pass computes the same dot products)."""
import pytest
import torch

from tokenmill import LLM, SamplingParams
from tokenmill.models.llama import LlamaForCausalLM


@pytest.fixture(scope="module")
def bf16_llm(tiny_llama):
    return LLM(str(tiny_llama), dtype="bfloat16", kv_cache_memory_gb=0.02, seed=0)


def test_greedy_tokens_equal_the_sampled_argmax(bf16_llm, monkeypatch):
    calls = []
    real = LlamaForCausalLM.greedy_tokens

    def counted(self, hidden, vocab_size):
        ids = real(self, hidden, vocab_size)
        calls.append(ids is not None)
        return ids
    monkeypatch.setattr(LlamaForCausalLM, "greedy_tokens", counted)
    prompts = [{"prompt_token_ids": list(range(10 + 7 * i, 40 + 9 * i))} for i in range(5)]
    fast = bf16_llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    assert calls and all(calls)  # the argmax pass ran for every step
    calls.clear()
    slow = bf16_llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0))
    assert not calls  # logprobs need the logits
    assert [o.outputs[0].token_ids for o in fast] == [o.outputs[0].token_ids for o in slow]


def test_rows_that_reshape_logits_are_not_argmaxed(bf16_llm):
    """A banned token (bad_words via logit_bias -100) must not come out of the argmax pass."""
    prompt = {"prompt_token_ids": list(range(20, 50))}
    plain = bf16_llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    first = plain[0].outputs[0].token_ids[0]
    banned = bf16_llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True,
                                                        logit_bias={first: -100}))
    assert banned[0].outputs[0].token_ids[0] != first


def test_a_model_with_its_own_logits_keeps_them(tiny_llama):
    """A subclass whose compute_logits does more than the LM head (here a sign flip, which moves the
    argmax) is never argmaxed behind its back."""
    class Flipped(LlamaForCausalLM):
        def compute_logits(self, hidden):
            return -super().compute_logits(hidden)
    llm = LLM(str(tiny_llama), dtype="bfloat16", kv_cache_memory_gb=0.02)
    model = llm.llm_engine.runner.model
    hidden = torch.randn(4, model.config.hidden_size)
    assert model.greedy_tokens(hidden, model.config.vocab_size) is not None
    model.__class__ = Flipped
    assert model.greedy_tokens(hidden, model.config.vocab_size) is None
