"""Speculative decoding: the n-gram proposer, exact verification (greedy token-identical, sampling
distribution-identical: a chi-square test), and rollback of rejected drafts that keeps the KV
accounting exact through preemption and prefix caching."""
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kv_cache_manager import CheckingExecutor, check_invariants

from tokenmill import LLM, SamplingParams
from tokenmill.config import EngineConfig, SpeculativeConfig
from tokenmill.core.engine_core import EngineCore
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.core.outputs import ModelRunnerOutput
from tokenmill.core.scheduler import SchedulerConfig
from tokenmill.request import Request, SpecDecodingStats
from tokenmill.spec.draft_length import DraftLength
from tokenmill.spec.ngram import NgramProposer
from tokenmill.spec.rejection import verify
from tokenmill.worker.sampler import Sampler
from tiny_models import make_tiny_model

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


# -- proposer ---------------------------------------------------------------------------------------
def test_ngram_proposes_what_followed_the_latest_match():
    p = NgramProposer(3, min_n=1, max_n=3)
    assert p.lookup([1, 2, 3, 9, 9, 1, 2, 3, 7, 7, 1, 2, 3]) == [7, 7, 1]  # latest earlier 1 2 3
    assert p.lookup([5, 6, 7, 8]) == []  # nothing repeats
    assert p.lookup([4, 5, 1, 2, 1], k=2) == [2, 1]  # falls back to the 1-gram "1"
    assert NgramProposer(3, min_n=2, max_n=3).lookup([4, 5, 1, 2, 1]) == []  # too short a match
    # the latest match of [8, 9] ends one token before the end: the copy runs on into itself
    assert NgramProposer(4, min_n=2, max_n=2).lookup([5, 8, 9, 8, 9]) == [8, 9, 8, 9]


def test_speculative_config_names_bad_fields():
    with pytest.raises(ValueError, match="unknown fields \\['bogus'\\]"):
        EngineConfig(speculative_config={"method": "ngram", "bogus": 1})
    with pytest.raises(ValueError, match="speculative_config.method must be one of ngram"):
        SpeculativeConfig(method="medusa")
    with pytest.raises(ValueError, match="prompt_lookup_min \\(5\\) must be <= prompt_lookup_max \\(2\\)"):
        SpeculativeConfig(prompt_lookup_min=5, prompt_lookup_max=2)


# -- verification -------------------------------------------------------------------------------------
class _Req:
    def __init__(self, rid, params, prompt=(1,), output=()):
        self.request_id, self.params = rid, params
        self.prompt_token_ids, self.output_token_ids, self.eos_token_id = list(prompt), list(output), None

    @property
    def num_output_tokens(self):
        return len(self.output_token_ids)


def test_rejection_sampling_preserves_the_target_distribution():
    """Drafts [d0, d1] over a 6-token vocabulary, 30,000 verifications (seeded generators, one per
    request id so each draw is independent): the first emitted token follows p_0 (with top_p and
    temperature applied as in a plain step), and, when d0 was accepted, the second follows p_1.
    Chi-square goodness of fit at significance 0.001."""
    from scipy.stats import chisquare
    torch.manual_seed(0)
    logits = torch.randn(3, 6) * 1.5
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=1)
    sampler = Sampler(6)
    reqs = [_Req(f"r{i}", SamplingParams(temperature=0.8, top_p=0.95, seed=i)) for i in range(30_000)]
    drafts = [[2, 4]] * len(reqs)
    out = verify(sampler, logits.repeat(len(reqs), 1), reqs, drafts)
    p = sampler.probs(sampler.process(logits, [_Req("x", params)] * 3), [_Req("x", params)] * 3)
    first = torch.tensor([t[0] for t in out.token_ids])
    _check(chisquare, first, p[0])
    second = torch.tensor([t[1] for t in out.token_ids if t[0] == 2])
    _check(chisquare, second, p[1])


def _check(chisquare, draws, p):
    counts = torch.bincount(draws, minlength=len(p)).double()
    keep = p > 0
    assert counts[~keep].sum() == 0, "sampled a token the target gives probability 0"
    expected = p[keep].double() / p[keep].double().sum() * len(draws)
    assert chisquare(counts[keep].numpy(), expected.numpy()).pvalue > 0.001


def test_greedy_verification_accepts_exactly_the_argmax_prefix():
    logits = torch.full((4, 5), -5.0)
    for row, best in enumerate([3, 1, 4, 0]):
        logits[row, best] = 5.0
    greedy = SamplingParams(temperature=0)
    assert verify(Sampler(5), logits, [_Req("a", greedy)], [[3, 1, 2]]).token_ids == [[3, 1, 4]]
    assert verify(Sampler(5), logits, [_Req("a", greedy)], [[3, 1, 4]]).token_ids == [[3, 1, 4, 0]]
    assert verify(Sampler(5), logits[:2], [_Req("a", greedy)], [[0]]).token_ids == [[3]]


# -- end to end -------------------------------------------------------------------------------------
def _repetitive_prompts(n=12, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        phrase = [rng.randrange(3, 500) for _ in range(rng.randint(3, 8))]
        shared = [7, 8, 9, 10, 11, 12, 13, 14] if i % 3 == 0 else []  # two full blocks of 4, cacheable
        out.append({"prompt_token_ids": shared + (phrase * 4)[: rng.randint(10, 40)] + [rng.randrange(3, 500)]})
    return out


@pytest.fixture(scope="module")
def plain(tiny_llama):
    return LLM(str(tiny_llama), dtype="float32", num_kv_blocks=256, block_size=4)


@pytest.fixture(scope="module")
def other_tiny(tmp_path_factory):
    """A different random tiny Llama (one layer) with the same tokenizer: a draft model."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny_draft"), "llama", seed=2, num_hidden_layers=1)


def _spec_config(method, tiny_llama, other_tiny):
    k = {"num_speculative_tokens": 3, "disable_by_batch_size": 64}
    return {"ngram": {**NGRAM, "disable_by_batch_size": 64},
            "layer_skip": {"method": "layer_skip", "num_draft_layers": 1, **k},
            "draft_self": {"method": "draft_model", "model": str(tiny_llama), **k},
            "draft_other": {"method": "draft_model", "model": str(other_tiny), **k}}[method]


@pytest.mark.parametrize("method", ["ngram", "layer_skip", "draft_self", "draft_other"])
@pytest.mark.parametrize("caching", [True, False])
def test_greedy_identical_with_and_without_speculation(tiny_llama, other_tiny, plain, method, caching, monkeypatch):
    """Mixed batches (prompt chunks beside verifications, different lengths), with preemption
    forced by a small cache, prefix caching on (shared prefixes, resumed requests) and off:
    token-identical to decoding without drafts, for each method (model drafts kept on even where
    they do not pay)."""
    monkeypatch.setattr(DraftLength, "_best", lambda self: self.k_max)
    params = [SamplingParams(max_tokens=24, temperature=0, ignore_eos=True) for _ in range(12)]
    expect = [o.outputs[0].token_ids for o in plain.generate(_repetitive_prompts(), params, use_tqdm=False)]
    spec = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=40, block_size=4, enable_prefix_caching=caching,
               max_num_batched_tokens=64, speculative_config=_spec_config(method, tiny_llama, other_tiny))
    outs = spec.generate(_repetitive_prompts(), params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expect
    stats = [o.metrics.spec_decoding for o in outs if o.metrics.spec_decoding]
    assert stats and sum(s.num_draft_tokens for s in stats) > 0
    if method in ("ngram", "draft_self"):
        assert sum(s.num_accepted_tokens for s in stats) > 0, "this workload should accept some drafts"
    if method == "draft_self":  # its own KV mirrors the target's: it drafts what the target says
        assert SpecDecodingStats.merged(stats).acceptance_rate > 0.9
    assert spec.llm_engine.core.scheduler.num_preemptions > 0
    if caching:
        assert spec.llm_engine.core.kv.prefix_stats.hits > 0
    assert spec.llm_engine.core.kv.pool.num_used_blocks == 0


def test_seeded_sampling_with_speculation_is_reproducible(tiny_llama):
    spec = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=256, block_size=4, speculative_config=NGRAM)
    params = SamplingParams(max_tokens=20, temperature=0.7, seed=11, ignore_eos=True, logprobs=2)
    a = spec.generate(_repetitive_prompts(4), params, use_tqdm=False)
    b = spec.generate(_repetitive_prompts(4), params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    for o in a:
        assert len(o.outputs[0].logprobs) == len(o.outputs[0].token_ids) == 20


# -- rollback -----------------------------------------------------------------------------------------
class SpeculatingExecutor(CheckingExecutor):
    """Proposes random drafts and accepts a random prefix of them (then one more token)."""

    def __init__(self, kv, rng: random.Random):
        super().__init__(kv)
        self.rng = rng

    def execute(self, out):
        for rid, drafts in out.spec_token_ids.items():
            assert len(drafts) < out.num_scheduled_tokens[rid]
        base = super().execute(out)
        tokens, proposals = [], []
        for rid in base.req_ids:
            drafts = out.spec_token_ids.get(rid, [])
            accepted = self.rng.randint(0, len(drafts))
            tokens.append(drafts[:accepted] + [self.rng.randrange(50)])
            self.num_tokens[rid] += accepted
            proposals.append([self.rng.randrange(50) for _ in range(self.rng.randint(0, 4))])
        return ModelRunnerOutput(base.req_ids, tokens, None, proposals)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(10, 40), block_size=st.sampled_from([2, 4]),
       budget=st.integers(4, 48), caching=st.booleans())
def test_random_acceptance_keeps_block_accounting_exact(seed, num_blocks, block_size, budget, caching):
    """Random drafts, random acceptance lengths, preemption under a small cache, aborts: refcounts
    always match, nothing leaks, every request finishes, and no block whose tokens were rolled back
    (or never computed) is findable by hash."""
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks, block_size, enable_caching=caching)
    core = EngineCore(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=6, max_model_len=10_000), kv,
                      SpeculatingExecutor(kv, rng))
    for i in range(8):
        n = rng.randint(1, min(12, num_blocks * block_size - 10))  # every request fits the whole cache
        core.add_request(Request(str(i), [rng.randrange(3) for _ in range(n)], SamplingParams(max_tokens=10), None,
                                 0.0, 10))
    for step in range(3000):
        if not core.has_unfinished_requests():
            break
        core.step()
        if step == 5:
            core.finish_requests(["3"])
        check_invariants(kv)
        for req in core.scheduler.running:
            for i, b in enumerate(kv.req_blocks.get(req.request_id, [])):
                if b.block_hash is not None:
                    assert (i + 1) * block_size <= req.num_computed_tokens <= req.num_tokens
    assert not core.has_unfinished_requests()
    assert kv.pool.num_free_blocks == num_blocks and not kv.req_blocks


def test_a_draft_model_skips_big_batches_and_drafts_only_over_whole_kv(tiny_llama, plain, monkeypatch):
    """Above disable_by_batch_size nobody drafts, so the draft model does not mirror those steps
    (its forward is not called); a request that lived through them, or that adopts a cached block
    computed then, never drafts (its draft KV has holes); a fresh request afterwards drafts over
    whole KV and, drafting for itself, accepts every draft. Outputs stay token-identical."""
    monkeypatch.setattr(DraftLength, "_best", lambda self: self.k_max)
    spec = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=256, block_size=4, max_num_batched_tokens=256,
               speculative_config={"method": "draft_model", "model": str(tiny_llama), "num_speculative_tokens": 3,
                                   "disable_by_batch_size": 2})
    proposer = spec.llm_engine.runner.proposer
    calls = []
    forward = proposer.model.forward
    proposer.model.forward = lambda *a, **k: calls.append(a[0].shape[0]) or forward(*a, **k)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    shared = [7, 8, 9, 10, 11, 12, 13, 14]
    big = [{"prompt_token_ids": shared + [20 + i, 30 + i, 40 + i]} for i in range(6)]
    outs = spec.generate(big, [params] * 6, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain.generate(big, [params] * 6,
                                                                                                     use_tqdm=False)]
    assert not any(o.metrics.spec_decoding and o.metrics.spec_decoding.num_draft_tokens for o in outs)
    assert not calls  # six at once, then fewer: every step either skipped or left nobody to draft for
    alone = [{"prompt_token_ids": shared + [99, 98, 97]}, {"prompt_token_ids": [201, 202, 203, 204, 205, 206, 207]}]
    for prompt, drafts in zip(alone, (False, True)):  # the first adopts the shared blocks computed above
        out = spec.generate([prompt], [params], use_tqdm=False)[0]
        assert out.outputs[0].token_ids == plain.generate([prompt], [params], use_tqdm=False)[0].outputs[0].token_ids
        stats = out.metrics.spec_decoding
        drafted = stats.num_draft_tokens if stats else 0
        assert (drafted > 0) == drafts, (prompt, stats)
        if drafts:
            assert stats.num_accepted_tokens == stats.num_draft_tokens
    assert calls  # mirrored once nobody was above the limit
