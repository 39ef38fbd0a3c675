"""Sampling defaults from a model folder's generation_config.json (torch-free).

As vLLM's `--generation-config auto`: the keys the model's authors set (temperature, top_p, top_k,
min_p, repetition_penalty, max_new_tokens) become SamplingParams defaults, and what the user asks
for wins over them. `do_sample` is ignored, as vLLM does.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

GENERATION_CONFIG_FILE = "generation_config.json"

# generation_config.json key -> SamplingParams field
_FIELDS: dict[str, str] = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
SAMPLING_FIELDS = frozenset(_FIELDS.values())
_INT_FIELDS = frozenset({"top_k", "max_tokens"})


def load_generation_config(model_path: str | Path | None) -> dict[str, Any]:
    """SamplingParams keyword arguments set by `model_path`/generation_config.json; {} when the
    folder has none, the file is unreadable, or it sets no sampling key."""
    return sampling_defaults(read_generation_config(model_path))


def eos_ids(raw: dict[str, Any]) -> list[int]:
    """The end-of-sequence ids a parsed generation config lists (one or several: Llama 3 ends a
    turn with <|eot_id|>, Qwen with <|im_end|>, besides the tokenizer's eos)."""
    eos = raw.get("eos_token_id")
    ids = [eos] if isinstance(eos, int) else eos if isinstance(eos, list) else []
    return [i for i in ids if isinstance(i, int) and not isinstance(i, bool) and i >= 0]


def read_generation_config(model_path: str | Path | None) -> dict[str, Any]:
    """The parsed file; {} when there is none or it is unreadable."""
    if model_path is None:
        return {}
    path = Path(model_path) / GENERATION_CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        logger.warning("ignoring %s: %s", path, e)
        return {}
    return raw if isinstance(raw, dict) else {}


def sampling_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """The sampling keys of a parsed generation config, renamed to SamplingParams fields."""
    out: dict[str, Any] = {}
    for key, field in _FIELDS.items():
        value = raw.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # absent, null or malformed: not a default
        out[field] = int(value) if field in _INT_FIELDS else float(value)
    return out
