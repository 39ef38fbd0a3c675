"""Beam search, vLLM's `LLM.beam_search` (names and semantics follow it).

Each step asks the engine for one token of every live beam with the 2 * beam_width most likely
alternatives (logprobs of the raw distribution), extends each beam by each alternative, and keeps
the beam_width best by cumulative logprob / length ** length_penalty (as transformers and vLLM;
the length counts the prompt, an ending EOS not). A beam that draws an end id is complete. The
prefix cache keeps each step's cost to the new tokens: a beam's prompt is its parent's plus one.
As in vLLM, a sequence's `tokens` and `text` hold the prompt too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tokenmill.request import Logprob
from tokenmill.sampling_params import BeamSearchParams, SamplingParams

if TYPE_CHECKING:
    from tokenmill.llm import LLM


@dataclass
class BeamSearchSequence:
    tokens: list[int]  # the prompt's, then the generated ones
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)  # one entry per generated token
    cum_logprob: float = 0.0
    text: str | None = None  # filled for the returned sequences
    finish_reason: str | None = None  # "stop" (an end id) or "length"
    stop_reason: int | None = None


@dataclass
class BeamSearchOutput:
    sequences: list[BeamSearchSequence]  # best first, at most beam_width


def beam_search_score(seq: BeamSearchSequence, end_ids: set[int], length_penalty: float) -> float:
    length = len(seq.tokens) - (1 if seq.tokens and seq.tokens[-1] in end_ids else 0)
    return seq.cum_logprob / (max(length, 1) ** length_penalty)


def beam_search(llm: LLM, prompt_ids: list[list[int]], params: BeamSearchParams) -> list[BeamSearchOutput]:
    engine = llm.llm_engine
    end_ids = {t for t in [engine.eos_token_id, *engine.extra_eos_ids] if t is not None}
    step = SamplingParams(max_tokens=1, temperature=params.temperature, logprobs=2 * params.beam_width,
                          ignore_eos=True)

    def score(seq: BeamSearchSequence) -> float:
        return beam_search_score(seq, end_ids, params.length_penalty)

    live = [[BeamSearchSequence(list(ids))] for ids in prompt_ids]
    done: list[list[BeamSearchSequence]] = [[] for _ in prompt_ids]
    room = min(engine.max_model_len, engine.kv_capacity_tokens)
    for _ in range(params.max_tokens):
        for i, beams in enumerate(live):  # a beam that fills the context ends
            done[i] += [_finished(b, "length") for b in beams if len(b.tokens) >= room]
            live[i] = [b for b in beams if len(b.tokens) < room]
        flat = [(i, beam) for i, beams in enumerate(live) for beam in beams]
        if not flat:
            break
        outs = llm.generate([{"prompt_token_ids": beam.tokens} for _, beam in flat], step, use_tqdm=False)
        candidates: list[list[BeamSearchSequence]] = [[] for _ in prompt_ids]
        for (i, beam), out in zip(flat, outs):
            if out.error is not None:
                raise ValueError(f"prompt {i}: {out.error}")
            entry = out.outputs[0].logprobs[0]
            for token, lp in entry.items():
                new = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [entry], beam.cum_logprob + lp.logprob)
                if token in end_ids and not params.ignore_eos:
                    done[i].append(_finished(new, "stop", token))
                else:
                    candidates[i].append(new)
        live = [sorted(c, key=score, reverse=True)[:params.beam_width] for c in candidates]
    tok = llm.get_tokenizer()
    results = []
    for i in range(len(prompt_ids)):
        best = sorted(done[i] + [_finished(b, "length") for b in live[i]], key=score, reverse=True)
        best = best[:params.beam_width]
        for seq in best:
            seq.text = tok.decode(seq.tokens, skip_special_tokens=params.skip_special_tokens)
        results.append(BeamSearchOutput(best))
    return results


def _finished(seq: BeamSearchSequence, reason: str, stop_token: int | None = None) -> BeamSearchSequence:
    seq.finish_reason, seq.stop_reason = reason, stop_token
    return seq
