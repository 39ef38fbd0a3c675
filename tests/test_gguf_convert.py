"""GGUF -> Hugging Face folder conversion, checked against transformers' own GGUF loader."""
from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tokenmill.models.default_model import DEFAULT_MODEL_NAME, find_default_gguf, resolve_default_model
from tokenmill.models import gguf_convert
from tokenmill.models.gguf_convert import gguf_to_hf_folder

TEXTS = ["Hello, world! The quick brown fox.", "Rocket 🚀 and party 🎉 emoji", "你好，世界。今天天气很好。"]


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return find_default_gguf()


@pytest.fixture(scope="module")
def folder(gguf_path: Path) -> Path:
    # Default cache on purpose: the rest of the suite reuses this conversion.
    return resolve_default_model()


@pytest.fixture(scope="module")
def reference_model(gguf_path: Path) -> torch.nn.Module:
    return _load_gguf_model(gguf_path)


def _load_gguf_model(path: Path) -> torch.nn.Module:
    """The model as transformers reads a GGUF: the loader `from_pretrained(gguf_file=...)` calls.

    Called directly because `from_pretrained(gguf_file=...)` insists on `accelerate`, which the
    project does not depend on; the config and every tensor still come from transformers' code.
    """
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with _each_file_parsed_once():
        hf_config = dict(load_gguf_checkpoint(str(path), return_tensors=False)["config"])
        config = AutoConfig.for_model(hf_config.pop("model_type"), **hf_config)
        model = AutoModelForCausalLM.from_config(config)
        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.float().eval()


@contextlib.contextmanager
def _each_file_parsed_once():
    """Memoizes two pure functions transformers' GGUF loader calls over and over: gguf-py's
    `GGUFReader` (the whole file, a 49k-token vocabulary with it, parsed on each of the loader's
    two calls) and `get_tensor_name_map` (rebuilt for each of ~400 modules). The loader's results
    are unchanged; the reference load takes about a third of the time."""
    readers: dict[str, gguf.GGUFReader] = {}
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

    def reader(path, mode="r"):
        key = f"{Path(path).resolve()}:{mode}"
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", reader)
        patch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(name_map))
        yield


def _load_folder_model(folder: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def _assert_same_weights_and_logits(ours: torch.nn.Module, ref: torch.nn.Module, ids: torch.Tensor) -> None:
    ours_sd, ref_sd = ours.state_dict(), ref.state_dict()
    assert ours_sd.keys() == ref_sd.keys()
    for name, tensor in ref_sd.items():
        assert ours_sd[name].dtype == torch.float32, name
        assert torch.equal(ours_sd[name], tensor), f"tensor {name} differs"
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, ref(ids).logits)


def test_config_describes_smollm2(folder: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    assert folder.name.startswith(DEFAULT_MODEL_NAME)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]) == (576, 30, 9)
    assert (cfg["num_key_value_heads"], cfg["head_dim"], cfg["vocab_size"]) == (3, 64, 49152)
    assert cfg["rope_theta"] == 100000.0 and cfg["rms_norm_eps"] == 1e-5
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "float32"
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (folder / name).is_file(), name


def test_weights_and_logits_match_transformers_gguf_loader(
    folder: Path, reference_model: torch.nn.Module
) -> None:
    ours = _load_folder_model(folder)
    ids = torch.tensor([[1, 9690, 198, 19556, 28, 940, 359, 346, 47]])
    _assert_same_weights_and_logits(ours, reference_model, ids)
    assert "lm_head.weight" not in _safetensors_keys(folder)


def _safetensors_keys(folder: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


def test_tokenizer_matches_gguf_tokenizer(folder: Path, gguf_path: Path) -> None:
    ours = AutoTokenizer.from_pretrained(str(folder))
    ref = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ids == ref.encode(text), text
        assert ours.decode(ids) == ref.decode(ids) == text
    assert (ours.bos_token, ours.eos_token) == ("<|im_start|>", "<|im_end|>")
    prompt = ours.apply_chat_template([{"role": "user", "content": "Hi!"}], tokenize=False,
                                      add_generation_prompt=True)
    assert "<|im_start|>" in prompt and prompt.endswith("<|im_start|>assistant\n")
    special = json.loads((folder / "special_tokens_map.json").read_text())
    assert special["eos_token"] == "<|im_end|>"


def test_second_call_is_a_cache_hit(folder: Path, gguf_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_conversion(*args: Any) -> None:
        raise AssertionError("the cached folder should have been reused")

    monkeypatch.setattr(gguf_convert, "_convert_into", no_conversion)
    again = gguf_to_hf_folder(gguf_path)
    assert again == folder
    leftovers = [p for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]
    assert leftovers == []


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="GGUF file not found"):
        gguf_to_hf_folder(tmp_path / "nope.gguf", cache_dir=tmp_path / "cache")


def test_non_gguf_file_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04 definitely a zip file")
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_to_hf_folder(bogus, cache_dir=tmp_path / "cache")


def test_unsupported_architecture_names_the_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(path), "phi2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    _finish(writer)
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'phi2'.*llama, qwen2"):
        gguf_to_hf_folder(path, cache_dir=cache)
    assert list((cache / "gguf").iterdir()) == []  # the failed attempt left nothing behind


def test_tiny_untied_qwen2_matches_transformers(tmp_path: Path) -> None:
    path = _write_tiny_qwen2(tmp_path / "tiny-qwen2.gguf")
    folder = gguf_to_hf_folder(path, cache_dir=tmp_path / "cache")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["tie_word_embeddings"] is False
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    _assert_same_weights_and_logits(_load_folder_model(folder), _load_gguf_model(path), ids)
    assert "lm_head.weight" in _safetensors_keys(folder)


def _write_tiny_qwen2(path: Path) -> Path:
    hidden, ffn, heads, kv_heads, vocab = 16, 32, 4, 2, 259
    head_dim = hidden // heads
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.2

    writer = gguf.GGUFWriter(str(path), "qwen2")
    _add_hparams(writer, {"block_count": 1, "context_length": 64, "embedding_length": hidden,
                          "feed_forward_length": ffn, "head_count": heads, "head_count_kv": kv_heads})
    _add_byte_level_vocab(writer, vocab)
    tensors: dict[str, np.ndarray] = {
        "token_embd.weight": rand(vocab, hidden), "output.weight": rand(vocab, hidden),
        "output_norm.weight": 1 + rand(hidden),
        "blk.0.attn_norm.weight": 1 + rand(hidden), "blk.0.ffn_norm.weight": 1 + rand(hidden),
        "blk.0.attn_q.weight": rand(heads * head_dim, hidden), "blk.0.attn_q.bias": rand(heads * head_dim),
        "blk.0.attn_k.weight": rand(kv_heads * head_dim, hidden), "blk.0.attn_k.bias": rand(kv_heads * head_dim),
        "blk.0.attn_v.weight": rand(kv_heads * head_dim, hidden), "blk.0.attn_v.bias": rand(kv_heads * head_dim),
        "blk.0.attn_output.weight": rand(hidden, heads * head_dim),
        "blk.0.ffn_gate.weight": rand(ffn, hidden), "blk.0.ffn_up.weight": rand(ffn, hidden),
        "blk.0.ffn_down.weight": rand(hidden, ffn),
    }
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    _finish(writer)
    return path


def _add_hparams(writer: gguf.GGUFWriter, hp: dict[str, Any]) -> None:
    writer.add_block_count(hp["block_count"])
    writer.add_context_length(hp["context_length"])
    writer.add_embedding_length(hp["embedding_length"])
    writer.add_feed_forward_length(hp["feed_forward_length"])
    writer.add_head_count(hp["head_count"])
    writer.add_head_count_kv(hp["head_count_kv"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1000000.0)


def _add_byte_level_vocab(writer: gguf.GGUFWriter, vocab: int) -> None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values()) + ["ĠĠ", "<|endoftext|>", "<|im_end|>"]
    assert len(tokens) == vocab
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 257 + [3, 3])
    writer.add_token_merges(["Ġ Ġ"])
    writer.add_bos_token_id(257)
    writer.add_eos_token_id(258)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
