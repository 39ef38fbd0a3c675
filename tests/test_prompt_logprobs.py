"""SamplingParams(prompt_logprobs=k) against transformers' teacher-forced log-softmax (tiny random
Llama, float32): every prompt position, with chunked prefill, in a batch, and beside a request whose
prefix is in the cache."""
from __future__ import annotations

import pytest
import torch
import transformers

from tokenmill import LLM, SamplingParams
from tokenmill.core.kv_cache_manager import KVCacheManager
from tokenmill.request import Request

TOL = 1e-4  # float32 both sides; different kernels and summation orders


@pytest.fixture(scope="module")
def reference(tiny_llama):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    return logprobs


@pytest.fixture(scope="module")
def chunked_llm(tiny_llama):
    """A small token budget: a 100-token prompt is prefilled over several steps."""
    return LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.02, max_num_batched_tokens=24,
               max_model_len=256)


def prompt(seed: int, n: int, vocab: int = 500) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def check_against(ref_lp: torch.Tensor, ids: list[int], plps, k: int) -> None:
    """Entry i holds prompt token i (its logprob and rank) and the reference's top-k."""
    assert len(plps) == len(ids) and plps[0] is None
    for i in range(1, len(ids)):
        row = ref_lp[i - 1]
        entry = plps[i]
        assert ids[i] in entry
        chosen = entry[ids[i]]
        assert abs(chosen.logprob - row[ids[i]].item()) < TOL, i
        assert chosen.rank == int((row > row[ids[i]]).sum()) + 1
        top = row.topk(k)
        ranked = sorted((lp.rank, tid) for tid, lp in entry.items() if lp.rank <= k)
        if k:
            assert [tid for _, tid in ranked] == top.indices.tolist()
            for tid, v in zip(top.indices.tolist(), top.values.tolist()):
                assert abs(entry[tid].logprob - v) < TOL
        assert len(entry) in (k, k + 1)


@pytest.mark.parametrize("k", [0, 3])
def test_matches_transformers_with_chunked_prefill(chunked_llm, reference, k):
    ids = prompt(k, 100)
    out = chunked_llm.generate([ids], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=k),
                               use_tqdm=False)[0]
    check_against(reference(ids), ids, out.prompt_logprobs, k)
    assert out.outputs[0].logprobs is None  # prompt logprobs do not imply sampled ones


def test_batch_and_shared_prefix(chunked_llm, reference):
    """A request whose prefix blocks are cached still gets every position (it does not skip its
    cached prefix); beside it, a request without prompt_logprobs and one with both kinds."""
    base = prompt(7, 64)
    chunked_llm.generate([base], SamplingParams(max_tokens=1), use_tqdm=False)  # base's blocks are cached
    shared = base + prompt(8, 20)
    other = prompt(9, 40)
    outs = chunked_llm.generate(
        [shared, other, base + prompt(10, 5)],
        [SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=2),
         SamplingParams(max_tokens=3, temperature=0),
         SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=1, logprobs=1)], use_tqdm=False)
    check_against(reference(shared), shared, outs[0].prompt_logprobs, 2)
    assert outs[0].num_cached_tokens == 0
    assert outs[1].prompt_logprobs is None
    third = base + prompt(10, 5)
    check_against(reference(third), third, outs[2].prompt_logprobs, 1)
    assert len(outs[2].outputs[0].logprobs) == 3
    # the same prompt without prompt_logprobs does use the cache
    again = chunked_llm.generate([shared], SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert again.num_cached_tokens >= 64


def test_n_samples_share_one_list(chunked_llm, reference):
    ids = prompt(11, 30)
    out = chunked_llm.generate([ids], SamplingParams(n=2, max_tokens=2, temperature=0.8, seed=1,
                                                     prompt_logprobs=0), use_tqdm=False)[0]
    check_against(reference(ids), ids, out.prompt_logprobs, 0)


def test_one_token_prompt(chunked_llm):
    out = chunked_llm.generate([[5]], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    assert out.prompt_logprobs == [None]


@pytest.mark.parametrize("value", [-1, 21, 1.5, "3"])  # True is 1, as vLLM
def test_bad_values_name_the_field(value):
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)


def test_kv_manager_gives_no_cached_prefix_to_prompt_logprobs():
    kv = KVCacheManager(16, 4)
    first = Request("a", list(range(12)), SamplingParams())
    assert kv.allocate_slots(first, 12)
    kv.cache_blocks(first, 12)
    assert kv.get_computed_blocks(Request("b", list(range(12)), SamplingParams()))[1] == 8
    assert kv.get_computed_blocks(Request("c", list(range(12)), SamplingParams(prompt_logprobs=0))) == ([], 0)


def test_preempted_request_fills_each_position_once(tiny_llama, reference):
    """A KV cache too small for both requests: one is preempted while decoding and recomputes its
    prompt, whose logprobs arrive again and must not be appended twice."""
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=14, block_size=16, max_num_batched_tokens=64,
              max_model_len=256)
    ids = [prompt(20, 100), prompt(21, 100)]
    outs = llm.generate(ids, SamplingParams(max_tokens=60, temperature=0, ignore_eos=True, prompt_logprobs=1),
                        use_tqdm=False)
    assert sum(o.metrics.num_preemptions for o in outs) >= 1
    for p, out in zip(ids, outs):
        check_against(reference(p), p, out.prompt_logprobs, 1)
