"""How an output ends, as vLLM ends it: a stop token's (or EOS's) text is left out unless
include_stop_str_in_output; a stop string must end in text produced after the first min_tokens
tokens, and the output's token ids end with the token that completed it, also when one step
appends several tokens (speculative decoding). Checked against a reference that decodes the whole
greedy output prefix by prefix."""
import random

import pytest

from tokenmill import LLM, SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def _prompts(n=6, seed=3):
    """Repetitive prompts, so n-gram drafts get accepted (several tokens per step)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        phrase = [rng.randrange(3, 500) for _ in range(rng.randint(3, 6))]
        out.append({"prompt_token_ids": (phrase * 5)[: rng.randint(12, 30)]})
    return out


def _greedy(llm: LLM, prompts, max_tokens=24, **kw) -> list:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw)
    return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]


def _decode(tok, ids: list[int]) -> str:
    """The text shown for these tokens: a token whose decode ends in an incomplete character (a
    byte-level token cut it) adds no text until a later one completes it, and a finished output
    leaves a still-incomplete tail out, as vLLM does."""
    for t in range(len(ids), 0, -1):
        text = tok.decode(ids[:t])
        if not text.endswith("\ufffd"):
            return text
    return ""


def _reference(tok, ids: list[int], stops: list[str], min_tokens: int) -> tuple[list[int], str, str | None]:
    """vLLM's rule, whole-prefix decoding: the first token t > min_tokens whose text completes a
    stop string (one that ends past the text shown before it) ends the output there."""
    prev = ""
    for t in range(1, len(ids) + 1):
        text = tok.decode(ids[:t])
        if text.endswith("\ufffd"):
            continue  # nothing new is shown yet
        if t > min_tokens:
            hits = [(i, s) for s in stops if (i := text.find(s, max(0, len(prev) - len(s) + 1))) != -1]
            if hits:
                i, s = min(hits)
                return ids[:t], text[:i], s
        prev = text
    return ids, _decode(tok, ids), None


@pytest.fixture(scope="module")
def greedy_outputs(tiny_llm):
    return _greedy(tiny_llm, _prompts())


def test_stop_token_text_is_left_out_unless_asked(tiny_llm, greedy_outputs):
    tok = tiny_llm.get_tokenizer()
    prompts = _prompts()
    for prompt, full in zip(prompts, greedy_outputs):
        ids = full.token_ids
        k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])  # the first time this token appears
        for include in (False, True):
            out = _greedy(tiny_llm, [prompt], stop_token_ids=[ids[k]], include_stop_str_in_output=include)[0]
            assert out.token_ids == ids[:k + 1]
            assert (out.finish_reason, out.stop_reason) == ("stop", ids[k])
            assert out.text == _decode(tok, ids[:k + 1] if include else ids[:k])


@pytest.mark.parametrize("min_tokens", [0, 1, 3, 6])
def test_stop_strings_match_the_reference(tiny_llm, greedy_outputs, min_tokens):
    tok = tiny_llm.get_tokenizer()
    prompts = _prompts()
    checked = 0
    for prompt, full in zip(prompts, greedy_outputs):
        ids = full.token_ids
        # stop strings taken from the output itself: a token's text, and a piece spanning two tokens
        pieces = [_decode(tok, ids[j:j + 1]).strip() for j in (1, 4, 9)]
        span = _decode(tok, ids[5:7])
        pieces.append(span[len(span) // 2 - 1: len(span) // 2 + 1])
        for stop in [p for p in pieces if p]:
            want_ids, want_text, want_stop = _reference(tok, ids, [stop], min_tokens)
            out = _greedy(tiny_llm, [prompt], stop=[stop], min_tokens=min_tokens)[0]
            assert (out.token_ids, out.text, out.stop_reason) == (want_ids, want_text, want_stop), (stop, min_tokens)
            checked += want_stop is not None
    assert checked >= 3  # the workload does hit stop strings


def test_stop_strings_with_several_tokens_per_step(tiny_llama, tiny_llm, greedy_outputs):
    """Speculative decoding appends up to 5 tokens a step: the output still ends at the token that
    completed the stop string, as without speculation."""
    spec = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=256, block_size=4, speculative_config=NGRAM)
    tok = tiny_llm.get_tokenizer()
    prompts = _prompts()
    accepted = checked = 0
    for prompt, full in zip(prompts, greedy_outputs):
        ids = full.token_ids
        later = _decode(tok, ids)[len(_decode(tok, ids[:4])):]
        for stop in dict.fromkeys(c for c in later if not c.isspace()):
            params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[stop])
            got = spec.generate([prompt], params, use_tqdm=False)[0]
            want_ids, want_text, want_stop = _reference(tok, ids, [stop], 0)
            checked += want_stop is not None
            assert (got.outputs[0].token_ids, got.outputs[0].text) == (want_ids, want_text), stop
            stats = got.metrics.spec_decoding
            accepted += stats.num_accepted_tokens if stats else 0
    assert checked >= 3
    assert accepted > 0, "the n-gram drafts should be accepted on these prompts"
    assert spec.llm_engine.core.kv.pool.num_used_blocks == 0


def test_tokens_after_the_stop_in_one_step_are_dropped(tiny_llm, greedy_outputs):
    """One core output carrying several tokens (accepted drafts) whose second completes the stop
    string: the output keeps the tokens up to it, and its text stops before the string."""
    from tokenmill.core.outputs import EngineCoreOutput

    tok = tiny_llm.get_tokenizer()
    engine = tiny_llm.llm_engine
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    ids = next(o.token_ids for o in greedy_outputs if _decode(tok, o.token_ids[:2]).strip())
    stop = _decode(tok, ids[:2]).strip()[-1]
    rid = engine.add_request(None, prompt, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, stop=[stop]))
    sample = engine.parents[rid].samples[0]
    engine._process(sample, EngineCoreOutput(sample.request_id, list(ids[:5]), None, None, None, 0, None))
    want_ids, want_text, want_stop = _reference(tok, ids[:5], [stop], 0)
    assert want_stop == stop and len(want_ids) <= 2
    assert (sample.token_ids, engine._completion(sample).text, sample.stop_reason) == (want_ids, want_text, stop)
    engine.abort_request(rid)
    assert engine.core.kv.pool.num_used_blocks == 0
