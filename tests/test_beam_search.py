"""LLM.beam_search (vLLM's) against a reference beam search over transformers' float32 logits for
the same tiny model: the same sequences in the same order, cumulative logprobs within 1e-4."""
import pytest
import torch
import transformers

from tokenmill import BeamSearchParams, SamplingParams


def _reference(model, prompt: list[int], width: int, max_tokens: int, eos: int, length_penalty: float = 1.0):
    """The textbook algorithm (transformers' candidates: 2 x width per beam), written independently."""
    def score(tokens, cum):
        n = len(tokens) - (1 if tokens[-1] == eos else 0)
        return cum / max(n, 1) ** length_penalty

    live, done = [(list(prompt), 0.0)], []
    for _ in range(max_tokens):
        cands = []
        for tokens, cum in live:
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([tokens])).logits[0, -1].double(), dim=-1)
            vals, ids = lp.topk(2 * width)
            for v, t in zip(vals.tolist(), ids.tolist()):
                (done if t == eos else cands).append((tokens + [t], cum + v))
        live = sorted(cands, key=lambda b: score(*b), reverse=True)[:width]
    return sorted(done + live, key=lambda b: score(*b), reverse=True)[:width]


@pytest.fixture(scope="module")
def hf_model(tiny_llama):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()


@pytest.mark.parametrize("width, length_penalty", [(2, 1.0), (4, 0.5)])
def test_matches_the_reference(tiny_llm, hf_model, width, length_penalty):
    prompts = [[5, 6, 7, 8], [40, 41, 42, 43, 44, 45]]
    eos = tiny_llm.llm_engine.eos_token_id
    params = BeamSearchParams(beam_width=width, max_tokens=5, length_penalty=length_penalty)
    outs = tiny_llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, out in zip(prompts, outs):
        ref = _reference(hf_model, prompt, width, 5, eos, length_penalty)
        assert [s.tokens for s in out.sequences] == [t for t, _ in ref]
        assert [s.cum_logprob for s in out.sequences] == pytest.approx([c for _, c in ref], abs=1e-4)
        for seq in out.sequences:
            assert len(seq.logprobs) == len(seq.tokens) - len(prompt)
            assert seq.text == tiny_llm.get_tokenizer().decode(seq.tokens, skip_special_tokens=True)


def test_width_one_is_greedy_and_bad_params_are_refused(tiny_llm):
    greedy = tiny_llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                               use_tqdm=False)[0].outputs[0].token_ids
    out = tiny_llm.beam_search([[5, 6, 7, 8]], BeamSearchParams(beam_width=1, max_tokens=6, ignore_eos=True))[0]
    assert out.sequences[0].tokens == [5, 6, 7, 8] + greedy and out.sequences[0].finish_reason == "length"
    text = tiny_llm.beam_search(["hello there"], BeamSearchParams(beam_width=2, max_tokens=2))[0]
    assert len(text.sequences) == 2 and text.sequences[0].text.startswith("hello there")
    for bad in ({"beam_width": 11}, {"beam_width": 0}, {"max_tokens": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            BeamSearchParams(**{"beam_width": 2, "max_tokens": 2, **bad})
    assert tiny_llm.llm_engine.core.kv.pool.num_used_blocks == 0
