"""The proposers that run a model: layer_skip (the target's first layers) and draft_model (a
second model with its own paged KV). Their drafts must be exactly the draft's greedy continuation
of each request's context, computed here independently by Hugging Face transformers (which checks
that the draft's KV at accepted positions, its own speculative slots and the early exit are all
right); the draft length follows measured cost and acceptance; the config names bad fields."""
import json

import pytest
import torch
from tiny_models import make_tiny_model

from tokenmill import LLM, SamplingParams
from tokenmill.config import SpeculativeConfig
from tokenmill.spec.draft_length import DraftLength

PROMPTS = [{"prompt_token_ids": [5, 9, 33, 7, 81, 9, 33, 7, 12]}, {"prompt_token_ids": list(range(40, 63))},
           {"prompt_token_ids": [300, 2, 300, 2, 300]}]


@pytest.fixture(scope="module")
def deep_tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny4"), "llama", seed=3, num_hidden_layers=4)


@pytest.fixture(scope="module")
def other_tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_draft"), "llama", seed=2, num_hidden_layers=1)


def _hf(folder):
    import transformers
    return transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _greedy(hf, ids: list[int], k: int, num_layers: int | None) -> list[int]:
    """k greedy tokens after ids from the first num_layers layers (all if None), final norm, LM head."""
    out = []
    with torch.no_grad():
        for _ in range(k):
            res = hf(torch.tensor([ids + out]), output_hidden_states=True, use_cache=False)
            if num_layers is None:
                logits = res.logits[0, -1]
            else:
                logits = hf.lm_head(hf.model.norm(res.hidden_states[num_layers][0, -1]))
            out.append(int(logits.argmax()))
    return out


def _recorded_drafts(llm) -> list[tuple[list[int], list[int]]]:
    proposer = llm.llm_engine.runner.proposer
    calls, propose = [], proposer.propose

    def record(reqs):
        drafts = propose(reqs)
        calls.extend((list(r.token_ids), d) for r, d in zip(reqs, drafts) if d)
        return drafts
    proposer.propose = record
    llm.generate(PROMPTS, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), use_tqdm=False)
    return calls


@pytest.mark.parametrize("num_layers", [1, 3])
def test_layer_skip_drafts_are_the_early_exit_greedy_continuation(deep_tiny, num_layers, monkeypatch):
    monkeypatch.setattr(DraftLength, "_best", lambda self: self.k_max)
    llm = LLM(str(deep_tiny), dtype="float32", num_kv_blocks=64, block_size=4,
              speculative_config={"method": "layer_skip", "num_draft_layers": num_layers, "num_speculative_tokens": 3})
    calls = _recorded_drafts(llm)
    assert len(calls) >= 6
    hf = _hf(deep_tiny)
    for ids, drafts in calls:
        assert drafts == _greedy(hf, ids, len(drafts), num_layers)


def test_draft_model_drafts_are_its_greedy_continuation(tiny_llama, other_tiny, monkeypatch):
    monkeypatch.setattr(DraftLength, "_best", lambda self: self.k_max)
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4,
              speculative_config={"method": "draft_model", "model": str(other_tiny), "num_speculative_tokens": 3})
    calls = _recorded_drafts(llm)
    assert len(calls) >= 6
    hf = _hf(other_tiny)
    for ids, drafts in calls:
        assert drafts == _greedy(hf, ids, len(drafts), None)


def test_a_quantized_draft_drafts_as_that_quantized_model_and_the_output_stays_the_targets(
        tiny_llama, other_tiny, monkeypatch):
    """speculative_config.quantization: the draft runs int8 blocks while the target stays float32;
    its drafts are exactly the greedy continuation of the same int8 model run as an engine of its
    own, and the target's greedy output is unchanged by them."""
    from tokenmill.quant.blocks import BlockLinearMethod
    monkeypatch.setattr(DraftLength, "_best", lambda self: self.k_max)
    llm = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4,
              speculative_config={"method": "draft_model", "model": str(other_tiny), "quantization": "int8",
                                  "num_speculative_tokens": 3})
    draft = llm.llm_engine.runner.proposer.model
    assert isinstance(draft.layers[0].mlp.down_proj.quant_method, BlockLinearMethod)
    assert not isinstance(llm.llm_engine.runner.model.layers[0].mlp.down_proj.quant_method, BlockLinearMethod)
    calls = _recorded_drafts(llm)
    assert len(calls) >= 6
    reference = LLM(str(other_tiny), dtype="float32", quantization="int8", num_kv_blocks=64, block_size=4)
    for ids, drafts in calls:
        params = SamplingParams(max_tokens=len(drafts), temperature=0, ignore_eos=True)
        out = reference.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0]
        assert drafts == list(out.outputs[0].token_ids)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    plain = LLM(str(tiny_llama), dtype="float32", num_kv_blocks=64, block_size=4)
    assert ([o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
            == [o.outputs[0].token_ids for o in plain.generate(PROMPTS, params, use_tqdm=False)])


def test_draft_model_kv_shares_the_memory_budget(tiny_llama):
    plain = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.01, block_size=4)
    spec = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.01, block_size=4,
               speculative_config={"method": "draft_model", "model": str(tiny_llama)})
    blocks = plain.llm_engine.config.cache.num_blocks
    assert spec.llm_engine.config.cache.num_blocks in (blocks // 2, blocks // 2 + 1)  # same draft: twice the bytes


# -- configuration --------------------------------------------------------------------------------
def test_speculative_config_fields_are_checked(tiny_llama, tmp_path):
    with pytest.raises(ValueError, match="speculative_config.method must be one of ngram, layer_skip, draft_model"):
        SpeculativeConfig(method="eagle")
    with pytest.raises(ValueError, match="speculative_config.model .* is required for method draft_model"):
        SpeculativeConfig(method="draft_model")
    with pytest.raises(ValueError, match="speculative_config.model .* allowed only there"):
        SpeculativeConfig(method="ngram", model=str(tiny_llama))
    with pytest.raises(ValueError, match="speculative_config.num_draft_layers applies to method layer_skip only"):
        SpeculativeConfig(method="ngram", num_draft_layers=2)
    with pytest.raises(ValueError, match="speculative_config.quantization applies to method draft_model only"):
        SpeculativeConfig(method="ngram", quantization="int8")
    with pytest.raises(ValueError, match="speculative_config.quantization must be one of gguf, none, int8"):
        SpeculativeConfig(method="draft_model", model=str(tiny_llama), quantization="int3")
    with pytest.raises(ValueError, match=r"speculative_config \(the draft model\): quantization='gguf'"):
        LLM(str(tiny_llama), dtype="float32", num_kv_blocks=16,
            speculative_config={"method": "draft_model", "model": str(tiny_llama), "quantization": "gguf"})
    with pytest.raises(ValueError, match="speculative_config.model path does not exist"):
        SpeculativeConfig(method="draft_model", model=str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="speculative_config.num_draft_layers must be < the model's 2 layers"):
        LLM(str(tiny_llama), dtype="float32", num_kv_blocks=16,
            speculative_config={"method": "layer_skip", "num_draft_layers": 2})


def test_draft_model_must_share_the_tokenizer(tiny_llama, tmp_path):
    other_vocab = make_tiny_model(tmp_path / "v384", "llama", vocab_size=384, num_hidden_layers=1)
    with pytest.raises(ValueError, match="speculative_config.model: the draft's vocab_size 384 differs"):
        LLM(str(tiny_llama), dtype="float32", num_kv_blocks=16,
            speculative_config={"method": "draft_model", "model": str(other_vocab)})
    same_size = make_tiny_model(tmp_path / "tok", "llama", num_hidden_layers=1)
    tok = json.loads((same_size / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]  # same size, two ids swapped
    (same_size / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="speculative_config.model: the draft's tokenizer .* differs"):
        LLM(str(tiny_llama), dtype="float32", num_kv_blocks=16,
            speculative_config={"method": "draft_model", "model": str(same_size)})


# -- draft length -------------------------------------------------------------------------------------
def _measured(acceptance: float, cost_ratio: float, k_max: int = 4) -> DraftLength:
    length = DraftLength(k_max, probe_every=8, prior_acceptance=acceptance)
    length.observe_times(0.010, 0.010 * cost_ratio)
    return length


def test_draft_length_follows_acceptance_and_cost():
    assert DraftLength(4).best_k() == 4  # nothing measured yet: try
    assert _measured(0.9, 0.05).best_k() == 4  # a cheap good draft: all of it
    assert 1 <= _measured(0.7, 0.25).best_k() < 4  # dearer: fewer
    weak = _measured(0.2, 0.5)  # an early exit the model was not trained for: off, probing now and then
    assert [weak.best_k() for _ in range(16)] == [0] * 7 + [1] + [0] * 7 + [1]


def test_draft_length_acceptance_is_per_reached_position():
    length = DraftLength(4, prior_acceptance=0.5)
    for _ in range(300):
        length.observe_verification(drafted=4, accepted=1)  # reached 2 positions, 1 accepted
    assert length.acceptance == pytest.approx(0.5, abs=0.01)
    for _ in range(300):
        length.observe_verification(drafted=2, accepted=2)
    assert length.acceptance > 0.97
