"""The cached GGUF index (models/gguf_index.py): a second open reads no field through gguf's reader
and gives the same metadata and the same tensor bytes; a stale, corrupt or unwritable index falls
back to the reader; weight loading is unchanged."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from tokenmill.models import gguf_index
from tokenmill.models.gguf_index import TOKENIZER_ARRAYS, open_gguf
from tokenmill.quant.gguf import iter_gguf_weights

HIDDEN, FFN, VOCAB = 32, 64, 300


def _write_gguf(path: Path) -> Path:
    """A one-layer llama with a tokenizer vocabulary and F32, F16 and Q8_0 tensors."""
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.2

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges(["t 1"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    q8 = gguf.quants.quantize(rand(FFN, HIDDEN), gguf.GGMLQuantizationType.Q8_0)
    tensors = {
        "token_embd.weight": rand(VOCAB, HIDDEN), "output_norm.weight": 1 + rand(HIDDEN),
        "blk.0.attn_norm.weight": 1 + rand(HIDDEN), "blk.0.ffn_norm.weight": 1 + rand(HIDDEN),
        "blk.0.attn_q.weight": rand(HIDDEN, HIDDEN), "blk.0.attn_k.weight": rand(HIDDEN // 2, HIDDEN),
        "blk.0.attn_v.weight": rand(HIDDEN // 2, HIDDEN), "blk.0.attn_output.weight": rand(HIDDEN, HIDDEN),
        "blk.0.ffn_up.weight": rand(FFN, HIDDEN).astype(np.float16), "blk.0.ffn_down.weight": rand(HIDDEN, FFN),
    }
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.add_tensor("blk.0.ffn_gate.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def warnings_seen(caplog, monkeypatch) -> pytest.LogCaptureFixture:
    """tokenmill's logger keeps its records to itself; let them reach caplog."""
    monkeypatch.setattr(logging.getLogger("tokenmill"), "propagate", True)
    caplog.set_level(logging.WARNING, logger="tokenmill.models.gguf_index")
    return caplog


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    return _write_gguf(tmp_path / "tiny.gguf")


def _reader_must_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args, **kwargs):
        raise AssertionError("gguf's reader ran although the index was cached")
    monkeypatch.setattr(gguf_index, "GGUFReader", fail)


def _assert_same(a: gguf_index.GGUFIndex, b: gguf_index.GGUFIndex) -> None:
    assert a.metadata == b.metadata
    assert [(t.name, t.tensor_type, t.shape, t.data.dtype, t.data.shape) for t in a.tensors] == \
        [(t.name, t.tensor_type, t.shape, t.data.dtype, t.data.shape) for t in b.tensors]
    for x, y in zip(a.tensors, b.tensors):
        assert np.array_equal(x.data.view(np.uint8), y.data.view(np.uint8)), x.name


def test_second_open_reads_the_index_only(model_file: Path, tmp_path: Path, monkeypatch) -> None:
    index_path = tmp_path / "cache" / "tiny.index.json"
    first = open_gguf(model_file, index_path)
    reader = gguf.GGUFReader(model_file)
    assert [t.name for t in first.tensors] == [t.name for t in reader.tensors]
    assert first.metadata["llama.embedding_length"] == HIDDEN
    assert not set(TOKENIZER_ARRAYS) & set(first.metadata)  # the vocabulary stays out of the index
    assert {t.tensor_type.name for t in first.tensors} == {"F32", "F16", "Q8_0"}
    _reader_must_not_run(monkeypatch)
    second = open_gguf(model_file, index_path)
    _assert_same(first, second)
    assert not second.tensors[0].data.flags.writeable  # a view of the file, never a copy to write into


def test_stale_or_corrupt_index_is_rebuilt(model_file: Path, tmp_path: Path, warnings_seen) -> None:
    index_path = tmp_path / "tiny.index.json"
    good = open_gguf(model_file, index_path)
    entry = json.loads(index_path.read_text())
    for bad in (dict(entry, file_size=entry["file_size"] + 1), dict(entry, version=0), "{not json"):
        index_path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
        _assert_same(good, open_gguf(model_file, index_path))
        assert json.loads(index_path.read_text()) == entry  # rewritten for this file
    entry["tensors"][-1]["offset"] = model_file.stat().st_size  # points past the end: not trusted
    index_path.write_text(json.dumps(entry))
    _assert_same(good, open_gguf(model_file, index_path))
    assert "runs past the end of the file" in warnings_seen.text


def test_unwritable_index_still_opens(model_file: Path, tmp_path: Path, warnings_seen) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    index = open_gguf(model_file, blocker / "tiny.index.json")  # its parent is a file
    assert index.metadata["general.architecture"] == "llama"
    assert "not cached" in warnings_seen.text
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_weights_load_the_same_through_the_index(model_file: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path / "cache"))
    first = list(iter_gguf_weights(model_file))
    assert list((tmp_path / "cache" / "gguf").glob("tiny-*.index.json"))
    _reader_must_not_run(monkeypatch)
    second = list(iter_gguf_weights(model_file))
    assert [name for name, _ in first] == [name for name, _ in second]
    for (name, a), (_, b) in zip(first, second):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), name
        else:  # block records of the Q8_0 tensor
            assert torch.equal(a.codes, b.codes) and torch.equal(a.d, b.d), name
