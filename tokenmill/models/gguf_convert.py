"""Convert a GGUF checkpoint into a Hugging Face-style model folder (float32 safetensors).

The folder is cached under a key of the file's resolved path, size and mtime, so only the first
call pays for dequantization and tokenizer conversion.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import torch
from gguf import GGUFReader
from safetensors.torch import save_file
from tqdm import tqdm

from tokenmill.models.gguf_arch import build_hf_config, check_architecture
from tokenmill.models.gguf_index import GGUFIndex, open_gguf, read_metadata
from tokenmill.models.gguf_tensors import iter_hf_tensors

logger = logging.getLogger(__name__)

# Bump when the output format changes, so stale cached folders are not reused.
CONVERTER_VERSION = 2
_UNWANTED_TOKENIZER_KEYS = ("is_local", "local_files_only", "gguf_file", "name_or_path")


def default_cache_dir() -> Path:
    env = os.environ.get("TOKENMILL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tokenmill"


def gguf_to_hf_folder(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Return a Hugging Face model folder converted from `gguf_path`, converting on first use."""
    path = _check_gguf_file(gguf_path)
    target = _cached_path(path, cache_dir)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _convert_into(path, tmp)
        _make_shareable(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not a lost race with another converter
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def gguf_index(gguf_path: str | Path, cache_dir: str | Path | None = None) -> GGUFIndex:
    """The file's metadata and tensor table, cached beside its converted folder (models/gguf_index.py)."""
    path = _check_gguf_file(gguf_path)
    return open_gguf(path, _cached_path(path, cache_dir, ".index.json"))


def _cached_path(path: Path, cache_dir: str | Path | None, suffix: str = "") -> Path:
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "gguf" / f"{path.stem}-{_cache_key(path)}{suffix}"


def _make_shareable(folder: Path) -> None:
    # safetensors writes its file 0600; give every file the umask-derived mode Python used for config.json.
    mode = (folder / "config.json").stat().st_mode & 0o777
    for f in folder.iterdir():
        os.chmod(f, mode)


def _check_gguf_file(gguf_path: str | Path) -> Path:
    path = Path(gguf_path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {str(gguf_path)!r}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"{str(path)!r} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    return path


def _cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path}|{st.st_size}|{st.st_mtime_ns}|v{CONVERTER_VERSION}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _convert_into(path: Path, out: Path) -> None:
    reader = GGUFReader(path)
    meta = read_metadata(reader)
    arch = check_architecture(meta.get("general.architecture"), repr(str(path)))
    config = build_hf_config(arch, meta, {t.name: [int(n) for n in t.shape] for t in reader.tensors})
    tensors = {t.name: torch.from_numpy(t.data) for t in
               tqdm(iter_hf_tensors(reader, arch, config), desc="Converting GGUF tensors", unit="tensor")}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _write_tokenizer(path, out, config["max_position_embeddings"], arch)


def _write_tokenizer(path: Path, out: Path, max_len: int, arch: str) -> None:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # transformers reads the model config of the architectures it knows (deepseek2 it does not);
    # the tokenizer itself comes from the file's tokenizer.* keys either way
    loader = AutoTokenizer if arch in GGUF_SUPPORTED_ARCHITECTURES else PreTrainedTokenizerFast
    tok = loader.from_pretrained(str(path.parent), gguf_file=path.name)
    # Keep the chat template inside tokenizer_config.json, where every transformers version looks.
    tok.save_pretrained(str(out), save_jinja_files=False)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in _UNWANTED_TOKENIZER_KEYS:
        cfg.pop(key, None)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # loads tokenizer.json as is, v4 and v5
    cfg["model_max_length"] = max_len
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    special = {k: str(v) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
               if (v := getattr(tok, k, None)) is not None}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n")
