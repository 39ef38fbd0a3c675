"""Tiny random-weight Hugging Face model folders, made by transformers itself, for architecture tests."""
from __future__ import annotations

from pathlib import Path

import torch

TINY_DIMS = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


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
        cfg = transformers.MistralConfig(**dims, sliding_window=None, tie_word_embeddings=False)
        model = transformers.MistralForCausalLM(cfg)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # random biases/norms so they are actually tested
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(mean=1.0 if "norm" in name else 0.0, std=0.1)
    model.save_pretrained(folder)
    _tokenizer_files(folder, dims["vocab_size"])
    return folder
