"""Our C++ CPU kernels (tokenmill/kernels/csrc), compiled for this machine at first use.

The build (g++ through torch.utils.cpp_extension, about a minute on 2 cores, announced in the log)
happens once per machine and source version; later processes load the cached library in well under
a second. Without a compiler,
or with TOKENMILL_CPU_KERNELS=0, `load()` returns False and callers use the pure-PyTorch path."""
from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = [_CSRC / name for name in ("paged_decode.cpp", "layer_ops.cpp", "panel_gemm.cpp", "kv_store.cpp",
                                      "prefill_attention.cpp")]
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fopenmp-simd", "-ffp-contract=fast"]
_lock = threading.Lock()
_state: dict[str, bool] = {}


def load() -> bool:
    """Build or load the kernels; True if torch.ops.tokenmill.* are usable."""
    with _lock:
        if "ok" not in _state:
            _state["ok"] = _build()
        return _state["ok"]


def _build() -> bool:
    if os.environ.get("TOKENMILL_CPU_KERNELS", "1") == "0":
        logger.info("C++ CPU kernels off (TOKENMILL_CPU_KERNELS=0): PyTorch ops for attention, linear and "
                    "layer ops (slower)")
        return False
    if _registered():
        return True
    try:
        from torch.utils import cpp_extension
        name = f"tokenmill_cpu_ops_{_build_tag()}"
        folder = _build_folder(cpp_extension, name)
        cached = folder is not None and (folder / f"{name}.so").is_file()
        if not cached:
            logger.info("compiling tokenmill's C++ CPU kernels for this CPU (once per machine and version, "
                        "about a minute on 2 cores; cached in %s)", folder or "torch's extension cache")
        t0 = time.monotonic()
        cpp_extension.load(name=name, sources=[str(s) for s in _SOURCES], extra_cflags=_FLAGS,
                           extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
        ok = _registered()
        if ok:
            logger.info("C++ CPU kernels %s (%s): paged decode and prefill attention, panel GEMM, fused layer "
                        "ops, KV store; built with %s", "loaded" if cached else
                        f"compiled in {time.monotonic() - t0:.0f} s", name, " ".join(_FLAGS[:2]))
        return ok
    except Exception as e:  # no compiler, no ninja, a build error: fall back, say why once
        logger.warning("tokenmill C++ CPU kernels unavailable (%s: %s); using the slower PyTorch ops instead",
                       type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return False


def _build_folder(cpp_extension, name: str) -> Path | None:
    try:
        return Path(cpp_extension._get_build_directory(name, verbose=False))
    except Exception:  # a private helper of torch: if it moves, only the message loses the path
        return None


def _build_tag() -> str:
    """The build folder's name: one per CPU, source location and source content. -march=native code
    must not be reused on another CPU (a shared home directory, a migrated VM); torch rebuilds in
    place when a .cpp changes but not when a header does, and two installs (a checkout and a wheel)
    sharing one folder would rebuild over each other's sources: a new folder for each avoids all
    three."""
    digest = hashlib.sha256()
    try:
        with open("/proc/cpuinfo") as f:
            digest.update("".join(line for line in f if line.startswith(("model name", "flags"))).encode())
    except OSError:
        pass
    digest.update(str(_CSRC.resolve()).encode())
    digest.update(" ".join(_FLAGS).encode())
    for path in sorted(_CSRC.iterdir()):
        if path.suffix in (".cpp", ".h"):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def _registered() -> bool:
    try:
        return all(hasattr(torch.ops.tokenmill, op) for op in _OPS)
    except (AttributeError, RuntimeError):
        return False


_OPS = ("paged_decode", "fused_add_rms_norm", "rms_norm", "silu_and_mul", "rotary_", "pack_panels",
        "panel_linear", "store_kv", "prefill_attention")


def paged_decode(q: torch.Tensor, kv_cache: tuple[torch.Tensor, ...], block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, block_size: int, scale: float) -> torch.Tensor:
    """q [B, H, D] (one query per sequence) attends to its whole cached context. -> [B, H, D] in q's dtype."""
    k, v = kv_cache[0], kv_cache[1]
    if len(kv_cache) == 4:
        k_scale, v_scale = kv_cache[2], kv_cache[3]
    else:
        k_scale = v_scale = _EMPTY
    out = torch.ops.tokenmill.paged_decode(q.float().contiguous(), k, v, k_scale, v_scale, block_tables,
                                           seq_lens, block_size, scale)
    return out.to(q.dtype)


_EMPTY = torch.empty(0)

