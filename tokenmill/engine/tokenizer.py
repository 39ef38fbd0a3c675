"""Tokenizers: loaded from the model folder (or --tokenizer), never from a hub."""
from __future__ import annotations

import json
from pathlib import Path


def load_tokenizer(path: str | Path):
    try:
        tok = _tokenizer_class(Path(path)).from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 - re-raised with the path named
        raise ValueError(f"cannot load a tokenizer from {str(path)!r}: {e}") from e
    # The engine checks lengths against max_model_len itself (and refuses with a clear error); the
    # tokenizer's own limit would only add a misleading "indexing errors" warning on long prompts.
    tok.model_max_length = 1 << 62
    return tok


# The classes AutoTokenizer resolves these names to without anything model-specific: transformers 5
# calls its generic fast tokenizer TokenizersBackend (PreTrainedTokenizerFast is the same class) and
# writes that name into the folders it saves.
_GENERIC_FAST = ("PreTrainedTokenizerFast", "TokenizersBackend")


def _tokenizer_class(folder: Path):
    """AutoTokenizer, except where the folder names the generic fast tokenizer (our GGUF conversions,
    the default model among them, and folders transformers 5 saved): AutoTokenizer picks that same
    class, but only after loading the model config, whose imports (transformers' model registry,
    torch.distributed.tensor, sympy) cost ~1.5 s of every start."""
    try:
        declared = json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        declared = None
    if declared in _GENERIC_FAST and (folder / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast
    from transformers import AutoTokenizer  # its import alone loads transformers' model registry
    return AutoTokenizer
