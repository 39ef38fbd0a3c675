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

from tokenmill.cpu import cpu_flags

logger = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
# Longest compiles first: ninja starts them in this order, so the slowest unit does not start last
_SOURCES = [_CSRC / name for name in ("paged_decode.cpp", "decode_avx512.cpp", "register_ops.cpp", "gemm_avx512.cpp",
                                      "quant_gemm.cpp", "gemm_pair_avx512.cpp", "prefill_attention.cpp",
                                      "panel_gemm.cpp", "layer_ops.cpp", "bf16_gemm.cpp", "kv_store.cpp", "cpu_isa.cpp",
                                      "quant_avx512.cpp", "layer_stack.cpp", "quant_argmax.cpp")]


def _baseline_flags() -> list[str]:
    """x86-64-v3 (AVX2 + FMA, every x86 server since 2013) where this CPU has it, else the compiler's
    default. Never -march=native: the AVX-512 paths are compiled in their own units under a target
    pragma and chosen at run time (csrc/cpu_isa.h), so the cached library also runs on a CPU without
    them (a shared home directory, a migrated VM, a wheel)."""
    return ["-mavx2", "-mfma", "-mf16c"] if {"avx2", "fma", "f16c"} <= cpu_flags() else []


def _emulation_flags() -> list[str]:
    """TOKENMILL_EMULATE_AVX512=1 builds a test library whose AVX-512 units run on SIMDe's portable
    intrinsics and whose CPU report claims AVX-512 F/BW/VL/BF16/VNNI (csrc/avx512_intrinsics.h): the
    AVX-512 paths' logic is then tested on a CPU without AVX-512 (tests/test_packaging.py). Never
    for serving: emulation is several times slower."""
    if os.environ.get("TOKENMILL_EMULATE_AVX512", "0") != "1":
        return []
    try:
        import simde_py
    except ImportError as e:
        raise RuntimeError("TOKENMILL_EMULATE_AVX512=1 needs the SIMDe headers: pip install simde-py") from e
    # -O1 (after the -O3 it overrides): at -O3 GCC takes 2.5 minutes on each of the two large emulated
    # units, at -O1 under 40 s, and the emulated kernel tests still run in about 15 s
    return ["-DTM_EMULATE_AVX512", f"-I{simde_py.get_include()}", "-O1"]


_FLAGS = ["-O3", *_baseline_flags(), *_emulation_flags(), "-fopenmp", "-fopenmp-simd", "-ffp-contract=fast"]
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
            logger.info("C++ CPU kernels %s (%s): paged decode and prefill attention, float32 and bf16 panel "
                        "GEMM, block-quantized (int8/int4) GEMM, fused layer ops, KV store; baseline %s, run-time ISA: %s", "loaded" if cached else
                        f"compiled in {time.monotonic() - t0:.0f} s", name, " ".join(_baseline_flags()) or "generic",
                        torch.ops.tokenmill.cpu_isa())
        return ok
    except Exception as e:  # no compiler, no ninja, a build error: fall back, say why once
        logger.warning("tokenmill C++ CPU kernels unavailable (%s: %s); using the slower PyTorch ops instead",
                       type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return False


def library_path() -> Path | None:
    """The built library of this source version, if it is there."""
    from torch.utils import cpp_extension
    name = f"tokenmill_cpu_ops_{_build_tag()}"
    folder = _build_folder(cpp_extension, name)
    path = folder / f"{name}.so" if folder else None
    return path if path and path.is_file() else None


def _build_folder(cpp_extension, name: str) -> Path | None:
    try:
        return Path(cpp_extension._get_build_directory(name, verbose=False))
    except Exception:  # a private helper of torch: if it moves, only the message loses the path
        return None


def _build_tag() -> str:
    """The build folder's name: one per baseline ISA (in the flags), source location and source
    content. torch rebuilds in place when a .cpp changes but not when a header does, and two installs
    (a checkout and a wheel) sharing one folder would rebuild over each other's sources: a new folder
    for each avoids both."""
    digest = hashlib.sha256()
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


_OPS = ("cpu_isa", "set_cpu_isa", "paged_decode", "fused_add_rms_norm", "rms_norm", "silu_and_mul", "rotary_",
        "pack_panels", "panel_linear", "pack_bf16_panels", "bf16_panel_linear", "bf16_swiglu", "bf16_argmax_linear",
        "store_kv", "prefill_attention",
        "pack_q4", "pack_q8", "q4_linear", "q8_linear", "q_dequantize", "q_dequantize_rows", "gemm_split")


def isa() -> str:
    """The kernels' instruction-set report: "level=avx512_bf16 best=avx512_bf16 features=avx2,fma,..."
    ("unavailable" without the kernels)."""
    return torch.ops.tokenmill.cpu_isa() if load() else "unavailable"


def emulated() -> bool:
    """True in the SIMDe test build (TOKENMILL_EMULATE_AVX512=1): the AVX-512 levels are emulated."""
    return "emulated=simde" in isa()


def isa_level() -> str:
    """The level kernels dispatch to now: avx512_bf16, avx512, avx2 or scalar."""
    return isa().split()[0].removeprefix("level=") if load() else "unavailable"


LEVELS = ("avx512_bf16", "avx512", "avx2", "scalar")  # widest first


def runnable_levels() -> list[str]:
    """The levels this CPU can run, widest first ([] without the kernels)."""
    if not load():
        return []
    best = isa().split()[1].removeprefix("best=")
    return list(LEVELS[LEVELS.index(best):])


def set_isa(cap: str) -> str:
    """Cap the run-time ISA (auto, avx512_bf16, avx512, avx2, scalar); returns the level now used.
    Tests and benchmarks compare the paths this way in one process. auto goes back to the process's
    own cap (TOKENMILL_CPU_ISA, read at load), so `TOKENMILL_CPU_ISA=avx2 pytest` stays on AVX2 after
    a test that compared levels."""
    if not load():
        raise RuntimeError("the C++ CPU kernels are not available")
    return torch.ops.tokenmill.set_cpu_isa(cap)


_batch_invariant = False


def set_batch_invariant(on: bool) -> bool:
    """Process-wide batch-invariant mode (kernels/csrc/cpu_isa.h): a row's result never depends on
    the rows it shares a call with. Returns the previous setting."""
    global _batch_invariant
    if not load():
        raise RuntimeError("the C++ CPU kernels are not available")
    previous = torch.ops.tokenmill.set_batch_invariant(bool(on))
    _batch_invariant = bool(on)
    return previous


def batch_invariant() -> bool:
    return _batch_invariant


def paged_decode(q: torch.Tensor, kv_cache: tuple[torch.Tensor, ...], block_tables: torch.Tensor,
                 seq_lens: torch.Tensor, block_size: int, scale: float, window: int | None = None) -> torch.Tensor:
    """q [B, H, D] (one query per sequence) attends to its cached context (only its last `window`
    tokens with a sliding window). -> [B, H, D] in q's dtype."""
    k, v = kv_cache[0], kv_cache[1]
    if len(kv_cache) == 4:
        k_scale, v_scale = kv_cache[2], kv_cache[3]
    else:
        k_scale = v_scale = _EMPTY
    out = torch.ops.tokenmill.paged_decode(q.float().contiguous(), k, v, k_scale, v_scale, block_tables,
                                           seq_lens, block_size, scale, window or 0)
    return out.to(q.dtype)


_EMPTY = torch.empty(0)

