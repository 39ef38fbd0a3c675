"""Per-model hooks and the one registry: a new architecture is its own class plus one registration;
configuration is resolved once into frozen records; the model's content identity (not its path)
keys the prefix cache."""
import dataclasses
import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tokenmill import LLM, SamplingParams
from tokenmill.config import EngineConfig
from tokenmill.engine.resolve import resolve_config, resolve_model
from tokenmill.models.llama import LlamaForCausalLM
from tokenmill.models.model_config import ModelConfig, load_model_config
from tokenmill.models.registry import get_model_class, register_model, supported_architectures

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": [5, 17, 99, 3, 42]}, {"prompt_token_ids": list(range(20, 60))}]

# A made-up architecture: Llama maths, but its own config keys and checkpoint names.
_TOY_NAMES = [(r"self_attn\.q_proj", "attn.wq"), (r"self_attn\.k_proj", "attn.wk"), (r"self_attn\.v_proj", "attn.wv"),
              (r"self_attn\.o_proj", "attn.wo"), (r"mlp\.gate_proj", "ffn.w1"), (r"mlp\.up_proj", "ffn.w3"),
              (r"mlp\.down_proj", "ffn.w2"), (r"input_layernorm", "norm1"), (r"post_attention_layernorm", "norm2")]


class ToyForCausalLM(LlamaForCausalLM):
    checkpoint_prefix = "backbone."
    stacked_params = {"attn.wq": ("self_attn.qkv_proj", 0), "attn.wk": ("self_attn.qkv_proj", 1),
                      "attn.wv": ("self_attn.qkv_proj", 2), "ffn.w1": ("mlp.gate_up_proj", 0),
                      "ffn.w3": ("mlp.gate_up_proj", 1)}

    @classmethod
    def config_from_hf(cls, hf):
        return ModelConfig.from_hf({**hf, "hidden_size": hf["d_model"], "num_hidden_layers": hf["n_layer"]})

    def map_checkpoint_name(self, name):
        name = name.replace("backbone.blocks.", "backbone.layers.").replace("attn.wo", "self_attn.o_proj")
        name = name.replace("ffn.w2", "mlp.down_proj").replace("norm1", "input_layernorm")
        name = name.replace("norm2", "post_attention_layernorm").replace("backbone.final_norm", "backbone.norm")
        return super().map_checkpoint_name(name.replace("backbone.embed", "backbone.embed_tokens"))


def _toy_folder(tiny_llama, dst):
    shutil.copytree(tiny_llama, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["architectures"] = ["ToyForCausalLM"]
    cfg["d_model"], cfg["n_layer"] = cfg.pop("hidden_size"), cfg.pop("num_hidden_layers")
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(dst / "model.safetensors"))
    renamed = {}
    for name, t in tensors.items():
        for pattern, new in _TOY_NAMES:
            name = re.sub(pattern, new, name)
        name = name.replace("model.layers.", "backbone.blocks.").replace("model.embed_tokens", "backbone.embed")
        renamed[name.replace("model.norm", "backbone.final_norm")] = t
    save_file(renamed, str(dst / "model.safetensors"))
    return dst


def test_a_toy_architecture_plugs_in_through_its_hooks(tiny_llama, tmp_path):
    folder = _toy_folder(tiny_llama, tmp_path / "toy")
    with pytest.raises(ValueError, match="unsupported architecture 'ToyForCausalLM'"):
        load_model_config(folder)
    register_model("ToyForCausalLM", ToyForCausalLM)
    assert "ToyForCausalLM" in supported_architectures() and get_model_class("ToyForCausalLM") is ToyForCausalLM
    toy = LLM(str(folder), dtype="float32", kv_cache_memory_gb=0.01)
    ref = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.01)
    assert isinstance(toy.llm_engine.runner.model, ToyForCausalLM)
    tokens = list(range(3, 40))
    torch.testing.assert_close(toy.llm_engine.runner.full_logits(tokens), ref.llm_engine.runner.full_logits(tokens),
                               rtol=0, atol=0)
    assert [o.outputs[0].token_ids for o in toy.generate(PROMPTS, GREEDY, use_tqdm=False)] == \
           [o.outputs[0].token_ids for o in ref.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_unexpected_and_missing_weights_are_named(tiny_llama, tmp_path):
    folder = shutil.copytree(tiny_llama, tmp_path / "broken")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="unexpected weight 'model.layers.0.mlp.extra.weight'"):
        LLM(str(folder), dtype="float32", kv_cache_memory_gb=0.01)
    del tensors["model.layers.0.mlp.extra.weight"], tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"weights missing for: \['layers.1.mlp.down_proj.weight'\]"):
        LLM(str(folder), dtype="float32", kv_cache_memory_gb=0.01)


def test_missing_config_key_is_named(tiny_llama, tmp_path):
    folder = shutil.copytree(tiny_llama, tmp_path / "nohidden")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["hidden_size"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="config.json has no 'hidden_size'"):
        LLM(str(folder), dtype="float32")


def test_configuration_is_resolved_once_into_frozen_records(tiny_llama):
    cfg = resolve_config(EngineConfig(model=str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.01,
                                      max_model_len=128, num_threads=1))
    assert cfg.model.dtype == "float32" and cfg.model.max_model_len == cfg.scheduler.max_model_len == 128
    assert cfg.cache.num_blocks * cfg.cache.block_size * cfg.cache.bytes_per_token <= 0.01 * (1 << 30)
    # tiny Llama: 2 layers x K,V x 2 KV heads x head dim 16 x 4 bytes
    assert cfg.cache.bytes_per_token == 2 * 2 * 2 * 16 * 4 and cfg.device.num_threads == 1
    for record in (cfg, cfg.model, cfg.cache, cfg.scheduler, cfg.device, cfg.model.arch):
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.__setattr__(dataclasses.fields(record)[0].name, None)
    with pytest.raises(ValueError, match="max_num_seqs must be an integer >= 1"):
        EngineConfig(max_num_seqs=0)


def test_content_identity_ignores_the_path_but_not_the_dtype_or_weights(tiny_llama, tmp_path):
    a = shutil.copytree(tiny_llama, tmp_path / "here")
    b = shutil.copytree(tiny_llama, tmp_path / "elsewhere" / "copy")
    ids = {name: resolve_model(EngineConfig(model=str(p), dtype=dt)).content_id
           for name, p, dt in [("a", a, "float32"), ("b", b, "float32"), ("a16", a, "bfloat16")]}
    assert ids["a"] == ids["b"] != ids["a16"]
    tensors = load_file(str(b / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 1
    save_file(tensors, str(b / "model.safetensors"))
    assert resolve_model(EngineConfig(model=str(b), dtype="float32")).content_id != ids["a"]
    # the same prompt hashes to the same blocks in two engines that load the same model from two paths
    e1 = LLM(str(a), dtype="float32", kv_cache_memory_gb=0.01).llm_engine
    e2 = LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.01).llm_engine
    assert e1.core.kv.extra_key == e2.core.kv.extra_key and str(tiny_llama) not in e1.core.kv.extra_key
