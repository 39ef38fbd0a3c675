"""Convert a GGUF checkpoint into a Hugging Face-style model folder (float32 safetensors).

The folder is cached under a key of the file's resolved path, size and mtime, so only the first
call pays for dequantization and tokenizer conversion.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file
from tqdm import tqdm

logger = logging.getLogger(__name__)

# Bump when the output format changes, so stale cached folders are not reused.
CONVERTER_VERSION = 1
SUPPORTED_GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                                "qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3: per-head q/k RMSNorm
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate_inp": "mlp.gate",  # MoE router
}
# MoE experts are one [experts, rows, cols] tensor each in GGUF, one tensor per expert in HF
_EXPERT_NAMES = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
# llama.cpp computes these itself or they carry nothing HF needs.
SKIPPED_TENSORS = {"rope_freqs.weight"}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
_UNWANTED_TOKENIZER_KEYS = ("is_local", "local_files_only", "gguf_file", "name_or_path")


def default_cache_dir() -> Path:
    env = os.environ.get("TOKENMILL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tokenmill"


def gguf_to_hf_folder(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """Return a Hugging Face model folder converted from `gguf_path`, converting on first use."""
    path = _check_gguf_file(gguf_path)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "gguf" / f"{path.stem}-{_cache_key(path)}"
    if target.is_dir():
        return target
    root.joinpath("gguf").mkdir(parents=True, exist_ok=True)
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
    meta = _read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r} in {str(path)!r}; "
                         f"supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    config = _build_config(arch, meta, shapes)
    tensors = _convert_tensors(reader, arch, config)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    _write_tokenizer(path, out, config["max_position_embeddings"])


def _read_metadata(reader: GGUFReader) -> dict[str, Any]:
    # The vocab arrays are large and only the tokenizer converter needs them.
    skip = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
            "tokenizer.ggml.scores")
    return {k: f.contents() for k, f in reader.fields.items() if k not in skip}


def _build_config(arch: str, meta: dict[str, Any], shapes: dict[str, list[int]]) -> dict[str, Any]:
    """`shapes` are GGUF tensor shapes, fastest dimension first (token_embd is [hidden, vocab])."""
    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = get("attention.key_length") or get("rope.dimension_count") or hidden // heads
    vocab = get("vocab_size") or shapes["token_embd.weight"][-1]
    config: dict[str, Any] = {
        "architectures": [SUPPORTED_GGUF_ARCHITECTURES[arch]],
        "model_type": {"qwen3moe": "qwen3_moe"}.get(arch, arch),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length") or get("expert_feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(head_dim),
        "hidden_act": "silu",
        "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": _f32(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    if arch in ("qwen2", "qwen3", "qwen3moe"):
        config["use_sliding_window"] = False
    if arch == "qwen3moe":
        config.update(num_experts=int(get("expert_count")), num_experts_per_tok=int(get("expert_used_count")),
                      moe_intermediate_size=int(get("expert_feed_forward_length")), norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[])
    if (scaling := _rope_scaling(arch, meta)) is not None:
        config["rope_scaling"] = scaling
    config.update(_special_token_ids(meta))
    return config


def _f32(value: float) -> float:
    """Shortest decimal that round-trips the float32 GGUF value (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def _rope_scaling(arch: str, meta: dict[str, Any]) -> dict[str, Any] | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "type": kind,
                               "factor": _f32(meta.get(f"{arch}.rope.scaling.factor", 1.0))}
    if (orig := meta.get(f"{arch}.rope.scaling.original_context_length")) is not None:
        scaling["original_max_position_embeddings"] = int(orig)
    return scaling


def _special_token_ids(meta: dict[str, Any]) -> dict[str, Any]:
    ids: dict[str, Any] = {}
    if (bos := meta.get("tokenizer.ggml.bos_token_id")) is not None:
        ids["bos_token_id"] = int(bos)
    if (pad := meta.get("tokenizer.ggml.padding_token_id")) is not None:
        ids["pad_token_id"] = int(pad)
    # Chat models often end a turn with eot/eom rather than eos; generation must stop on all.
    eos = [int(meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                   "tokenizer.ggml.eom_token_id") if meta.get(k) is not None]
    eos = list(dict.fromkeys(eos))
    if eos:
        ids["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    return ids


def _convert_tensors(reader: GGUFReader, arch: str, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for t in tqdm(reader.tensors, desc="Converting GGUF tensors", unit="tensor"):
        if t.name in SKIPPED_TENSORS:
            logger.warning("skipping GGUF tensor %s: llama3-style rope scaling is not reconstructed", t.name)
            continue
        # dequantize() already returns numpy order (the reverse of GGUF's ne[] shape).
        weights = dequantize(t.data, t.tensor_type)
        if arch == "llama":
            weights = _unpermute_qk(t.name, weights, config)
        if (names := expert_tensor_names(t.name, len(weights))) is not None:  # [experts, out, in]: one each
            for name, w in zip(names, weights):
                out[name] = torch.from_numpy(np.array(w, dtype=np.float32, order="C"))
            continue
        # Always copy: F32 tensors come back as read-only views of the memory-mapped file.
        out[hf_tensor_name(t.name)] = torch.from_numpy(np.array(weights, dtype=np.float32, order="C"))
    return out


def expert_tensor_names(gguf_name: str, num_experts: int) -> list[str] | None:
    """HF names of the per-expert tensors a stacked GGUF expert tensor (`blk.3.ffn_up_exps.weight`)
    splits into; None for any other tensor."""
    m = _BLOCK_RE.match(gguf_name)
    if not (m and m.group(2) in _EXPERT_NAMES):
        return None
    return [f"model.layers.{m.group(1)}.mlp.experts.{e}.{_EXPERT_NAMES[m.group(2)]}.{m.group(3)}"
            for e in range(num_experts)]


def hf_tensor_name(gguf_name: str) -> str:
    """Map a GGUF tensor name (`blk.3.attn_q.weight`) to its HF name (`model.layers.3.self_attn.q_proj.weight`)."""
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    raise ValueError(f"unknown GGUF tensor {gguf_name!r}; cannot map it to a Hugging Face name")


def _unpermute_qk(name: str, weights: np.ndarray, config: dict[str, Any]) -> np.ndarray:
    if ".attn_q." in name:
        return unpermute_qk_rows(weights, config["num_attention_heads"])
    if ".attn_k." in name:
        return unpermute_qk_rows(weights, config["num_key_value_heads"])
    return weights


def unpermute_qk_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (it interleaves each head's two rope halves). Rows move
    whole, so this works on float rows and on rows of quantized blocks alike."""
    half = rows.shape[0] // n_head // 2
    w = rows.reshape(n_head, half, 2, *rows.shape[1:])
    return w.swapaxes(1, 2).reshape(rows.shape)


def gguf_qk_heads(reader: GGUFReader) -> dict[str, int]:
    """GGUF tensor name -> head count for the Q/K tensors whose rows need un-permuting (llama only)."""
    meta = _read_metadata(reader)
    arch = meta.get("general.architecture")
    if arch != "llama":
        return {}
    heads = int(meta[f"{arch}.attention.head_count"])
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    return {t.name: heads if ".attn_q." in t.name else kv_heads
            for t in reader.tensors if ".attn_q." in t.name or ".attn_k." in t.name}


def _write_tokenizer(path: Path, out: Path, max_len: int) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
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
