"""Tiny random-weight Hugging Face model folders, made by transformers itself, for architecture tests."""
from __future__ import annotations

from pathlib import Path

import torch

TINY_DIMS = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


# MoE: 8 routed experts, 2 per token (HF names differ per family; each config maps its own)
MOE_DIMS = dict(num_experts=8, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
# MLA: latent 32 + shared RoPE key 8 per token, instead of 2 x 4 heads x 24 decompressed
MLA_DIMS = dict(kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)


def _tokenizer_files(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer with a vocabulary that fits the tiny model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 8, special_tokens=["<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = ["The quick brown fox jumps over the lazy dog. " * 4, "Paris is the capital of France.",
              "Hello world, how are you today? 你好世界 🙂", "one two three four five six seven eight"] * 20
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                          "{% if add_generation_prompt %}<s>assistant:{% endif %}")
    fast.save_pretrained(folder)


def make_tiny_model(folder: Path, arch: str = "llama", seed: int = 0, **overrides) -> Path:
    import transformers

    torch.manual_seed(seed)
    dims = {**TINY_DIMS, "bos_token_id": 0, "eos_token_id": 1, **overrides}
    if arch == "llama":
        cfg = transformers.LlamaConfig(**dims, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**dims, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif arch == "mistral":
        cfg = transformers.MistralConfig(**{"sliding_window": None, **dims}, tie_word_embeddings=False)
        model = transformers.MistralForCausalLM(cfg)
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(**{"head_dim": 32, **dims}, tie_word_embeddings=True)
        model = transformers.Qwen3ForCausalLM(cfg)
    elif arch == "mixtral":
        cfg = transformers.MixtralConfig(**{"num_local_experts": 8, "num_experts_per_tok": 2, **dims},
                                         tie_word_embeddings=False)
        model = transformers.MixtralForCausalLM(cfg)
    elif arch == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(**{**MOE_DIMS, "shared_expert_intermediate_size": 48, "norm_topk_prob": False,
                                             "decoder_sparse_step": 1, **dims}, tie_word_embeddings=False)
        model = transformers.Qwen2MoeForCausalLM(cfg)
    elif arch == "qwen3_moe":
        cfg = transformers.Qwen3MoeConfig(**{**MOE_DIMS, "head_dim": 32, "norm_topk_prob": True, **dims},
                                          tie_word_embeddings=False)
        model = transformers.Qwen3MoeForCausalLM(cfg)
    elif arch == "deepseek_v2":
        cfg = transformers.DeepseekV2Config(**{**MOE_DIMS, **MLA_DIMS, "n_shared_experts": 1, "first_k_dense_replace": 1,
                                               "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2,
                                               "routed_scaling_factor": 1.5, **dims,
                                               "num_key_value_heads": dims["num_attention_heads"]}, tie_word_embeddings=False)
        model = transformers.DeepseekV2ForCausalLM(cfg)
    elif arch == "deepseek_v3":
        cfg = transformers.DeepseekV3Config(**{**MOE_DIMS, **MLA_DIMS, "n_shared_experts": 1, "first_k_dense_replace": 1,
                                               "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5,
                                               "norm_topk_prob": True, **dims,
                                               "num_key_value_heads": dims["num_attention_heads"]}, tie_word_embeddings=False)
        model = transformers.DeepseekV3ForCausalLM(cfg)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # random biases/norms/routers so they are actually tested
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(mean=1.0 if "norm" in name else 0.0, std=0.1)
            elif name.endswith(("gate.weight", "shared_expert_gate.weight")):
                p.normal_(std=0.3)  # routers: distinct expert choices per token
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(std=0.05)
    model.save_pretrained(folder)
    _tokenizer_files(folder, dims["vocab_size"])
    return folder
