"""Tokenizers: loaded from the model folder (or --tokenizer), never from a hub."""
from __future__ import annotations

from pathlib import Path


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - re-raised with the path named
        raise ValueError(f"cannot load a tokenizer from {str(path)!r}: {e}") from e
