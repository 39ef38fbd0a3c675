"""GGUF checkpoints of the newer families (qwen3, qwen3moe) convert to folders that transformers
reads as it reads the GGUF itself (same tensors, same logits), and our engine matches them."""
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from test_gguf_convert import (_add_byte_level_vocab, _add_hparams, _assert_same_weights_and_logits, _finish,
                               _load_folder_model, _load_gguf_model)

from tokenmill.engine.engine import LLMEngine
from tokenmill.models.gguf_convert import gguf_to_hf_folder


def _write_tiny(path: Path, arch: str) -> Path:
    # head_dim 128: transformers' GGUF loader ignores attention.key_length for qwen3 (takes the default)
    hidden, ffn, heads, kv_heads, head_dim, vocab, experts = 16, 32, 4, 2, 128, 259, 4
    if arch == "qwen3moe":
        ffn = 768  # ... and expert_feed_forward_length (takes 768)
    rng = np.random.default_rng(0)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32) * 0.2

    writer = gguf.GGUFWriter(str(path), arch)
    _add_hparams(writer, {"block_count": 2, "context_length": 64, "embedding_length": hidden,
                          "feed_forward_length": ffn, "head_count": heads, "head_count_kv": kv_heads})
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if arch == "qwen3moe":
        writer.add_expert_count(experts)
        writer.add_expert_used_count(2)
        writer.add_expert_feed_forward_length(ffn)
    _add_byte_level_vocab(writer, vocab)
    tensors = {"token_embd.weight": rand(vocab, hidden), "output.weight": rand(vocab, hidden),
               "output_norm.weight": 1 + rand(hidden)}
    for i in range(2):
        b = f"blk.{i}."
        tensors.update({
            b + "attn_norm.weight": 1 + rand(hidden), b + "ffn_norm.weight": 1 + rand(hidden),
            b + "attn_q.weight": rand(heads * head_dim, hidden), b + "attn_k.weight": rand(kv_heads * head_dim, hidden),
            b + "attn_v.weight": rand(kv_heads * head_dim, hidden), b + "attn_output.weight": rand(hidden, heads * head_dim),
            b + "attn_q_norm.weight": 1 + rand(head_dim), b + "attn_k_norm.weight": 1 + rand(head_dim)})
        if arch == "qwen3moe":
            tensors.update({b + "ffn_gate_inp.weight": rand(experts, hidden) * 5,
                            b + "ffn_gate_exps.weight": rand(experts, ffn, hidden),
                            b + "ffn_up_exps.weight": rand(experts, ffn, hidden),
                            b + "ffn_down_exps.weight": rand(experts, hidden, ffn)})
        else:
            tensors.update({b + "ffn_gate.weight": rand(ffn, hidden), b + "ffn_up.weight": rand(ffn, hidden),
                            b + "ffn_down.weight": rand(hidden, ffn)})
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    _finish(writer)
    return path


@pytest.mark.parametrize("arch", ["qwen3", "qwen3moe"])
def test_gguf_converts_and_our_engine_matches(tmp_path, arch):
    path = _write_tiny(tmp_path / f"tiny-{arch}.gguf", arch)
    folder = gguf_to_hf_folder(path, cache_dir=tmp_path / "cache")
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]])
    reference = _load_gguf_model(path)
    _assert_same_weights_and_logits(_load_folder_model(folder), reference, ids)
    ours = LLMEngine(model=str(path), dtype="float32", num_kv_blocks=16, block_size=4).runner.full_logits(ids[0].tolist())
    with torch.no_grad():
        torch.testing.assert_close(ours, reference(ids).logits[0], atol=1e-4, rtol=1e-4)
