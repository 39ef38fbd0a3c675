"""A model's content identity: what makes its KV bytes what they are, independent of where the
files live. Two engines (on two machines, or under two paths) loading the same checkpoint in the
same dtype get the same id, so their prefix-cache block hashes agree (a prerequisite for shipping
KV between them)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

_EDGE_BYTES = 1 << 20  # of each weight file, from the start and from the end


def weights_fingerprint(folder: str | Path) -> str:
    """sha256 over each safetensors file's name, size, first and last MiB. The header (tensor
    names, shapes, dtypes, offsets) sits at the start; the edges cover the first and last tensors.
    Cheap on any size (a full digest of a 100 GB checkpoint would take minutes)."""
    digest = hashlib.sha256()
    for file in sorted(Path(folder).glob("*.safetensors")):
        size = file.stat().st_size
        digest.update(f"{file.name}|{size}|".encode())
        with file.open("rb") as f:
            digest.update(f.read(_EDGE_BYTES))
            if size > 2 * _EDGE_BYTES:
                f.seek(size - _EDGE_BYTES)
                digest.update(f.read(_EDGE_BYTES))
    return digest.hexdigest()


def model_content_id(hf_config: dict, folder: str | Path, dtype: str) -> str:
    arch = (hf_config.get("architectures") or ["?"])[0]
    # writer-specific keys (_name_or_path may hold a local path; transformers_version) do not matter
    facts = {k: v for k, v in hf_config.items() if not k.startswith("_") and k != "transformers_version"}
    config = json.dumps(facts, sort_keys=True, separators=(",", ":"))
    raw = f"{arch}|{dtype}|{hashlib.sha256(config.encode()).hexdigest()}|{weights_fingerprint(folder)}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]
