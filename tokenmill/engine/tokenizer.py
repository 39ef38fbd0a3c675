"""Tokenizers: loaded from the model folder (or --tokenizer), never from a hub."""
from __future__ import annotations

from pathlib import Path


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - re-raised with the path named
        raise ValueError(f"cannot load a tokenizer from {str(path)!r}: {e}") from e
    # The engine checks lengths against max_model_len itself (and refuses with a clear error); the
    # tokenizer's own limit would only add a misleading "indexing errors" warning on long prompts.
    tok.model_max_length = 1 << 62
    return tok
