"""A .gguf file's small metadata fields and tensor table, cached as JSON next to its converted folder.

gguf's reader parses every field when it opens a file, the tokenizer's arrays too: the default
model's 49,152 tokens, 48,900 merges and token types are ~250,000 numpy slices, 2-4 s of every
start that loads its weights. Loading needs only the small fields and each tensor's type, shape
and offset. They are read once with gguf's reader and kept under the converted folder's key (the
file's resolved path, size and mtime); later opens map the tensors at the offsets the reader found.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

logger = logging.getLogger(__name__)

# Bump when the index's fields change, so older files are rebuilt.
INDEX_VERSION = 1
# The vocabulary arrays: large, and only the tokenizer converter (through transformers) needs them.
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                    "tokenizer.ggml.scores")


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # dims, fastest first (gguf's order)
    data: np.ndarray        # read-only view of the mapped file, shaped as gguf's reader shapes it


@dataclass(frozen=True)
class GGUFIndex:
    metadata: dict[str, Any]  # every field but TOKENIZER_ARRAYS, as gguf's `contents()` gives it
    tensors: list[GGUFTensor]


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    return {k: f.contents() for k, f in reader.fields.items() if k not in TOKENIZER_ARRAYS}


def open_gguf(path: Path, index_path: Path | None) -> GGUFIndex:
    """The file's index: from `index_path` when it holds one for this file, else read with gguf's
    reader and written there (skipped, with a warning, where it cannot be written)."""
    if index_path is not None:
        try:
            return _from_entry(path, json.loads(index_path.read_text()))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as e:
            logger.warning("GGUF index %s unreadable (%s); reading the file again", index_path, e)
    entry = _entry(path, GGUFReader(path))
    if index_path is not None:
        _write(index_path, entry)
    return _from_entry(path, entry)  # the same views whether the index was cached or just read


def _entry(path: Path, reader: GGUFReader) -> dict[str, Any]:
    return {"version": INDEX_VERSION, "file_size": path.stat().st_size, "metadata": read_metadata(reader),
            "tensors": [{"name": t.name, "type": int(t.tensor_type), "shape": [int(n) for n in t.shape],
                         "offset": int(t.data_offset), "dtype": t.data.dtype.str, "data_shape": list(t.data.shape)}
                        for t in reader.tensors]}


def _from_entry(path: Path, entry: dict[str, Any]) -> GGUFIndex:
    if entry.get("version") != INDEX_VERSION or entry["file_size"] != path.stat().st_size:
        raise ValueError("written for another file or index version")
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for t in entry["tensors"]:
        dtype, shape = np.dtype(t["dtype"]), tuple(t["data_shape"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if t["offset"] + nbytes > raw.size:
            raise ValueError(f"tensor {t['name']!r} runs past the end of the file")
        data = raw[t["offset"]:t["offset"] + nbytes].view(dtype).reshape(shape)
        tensors.append(GGUFTensor(t["name"], GGMLQuantizationType(t["type"]), tuple(t["shape"]), data))
    return GGUFIndex(entry["metadata"], tensors)


def _write(index_path: Path, entry: dict[str, Any]) -> None:
    tmp = index_path.with_name(f".{index_path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    try:
        index_path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, index_path)  # atomic: a concurrent start reads the old file or the new one
    except (OSError, TypeError, ValueError) as e:  # unwritable place, or a field JSON cannot hold
        logger.warning("GGUF index not cached at %s (%s); the next start reads the file again", index_path, e)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
