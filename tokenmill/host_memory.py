"""Host memory backed by transparent huge pages (2 MiB) where the kernel allows it.

Why: a decode step streams every weight once and reads KV blocks scattered over a multi-GiB cache.
With 4 KiB pages each 4 KiB of weights costs a TLB miss, and inside a VM a miss walks two page
tables. One 2 MiB page covers 512 of them: on machine B (a Firecracker VM) a batch-1 pass over the
default model's bf16 weights ran 1.49x faster and a 32-row pass 1.8x (docs/BENCHMARKS.md, "Huge
pages").

How: most Linux servers set THP to `madvise` (only regions that ask get huge pages), and tensors
come from malloc, whose regions are not 2 MiB aligned and hold one tensor each (a 1 MiB weight can
never sit in a huge page). So we allocate one zero-filled region, lazily mapped (calloc), cut a 2 MiB
aligned span out of it and `madvise(MADV_HUGEPAGE)` it before anything touches it; the weight arena
(models/weight_arena.py) and the KV cache (attention/kv_cache.py) are carved from such spans.

Where THP is `never`, on a kernel without it, or off Linux, the advice fails quietly and the memory
is ordinary. `TOKENMILL_HUGE_PAGES=0` turns the advice off (for A/B measurements).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import threading

import numpy as np
import torch

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23  # Linux 5.14+: map pages writable without writing them
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
HUGE_PAGES_ENV = "TOKENMILL_HUGE_PAGES"  # "0": never advise (A/B measurements)
_THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_wanted() -> bool:
    return os.environ.get(HUGE_PAGES_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=1)
def thp_mode() -> str:
    """The kernel's THP policy: always, madvise, never, or unavailable (no THP / not Linux)."""
    try:
        with open(_THP_ENABLED) as f:
            text = f.read()
    except OSError:
        return "unavailable"
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return "unavailable"


@functools.lru_cache(maxsize=1)
def _madvise():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge(address: int, nbytes: int) -> bool:
    """Ask for huge pages on the whole 2 MiB pages inside [address, address + nbytes); False when
    not wanted, not possible, or refused."""
    if not huge_pages_wanted() or thp_mode() not in ("always", "madvise"):
        return False
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + nbytes) // HUGE_PAGE * HUGE_PAGE
    madvise = _madvise()
    if madvise is None or end <= start:
        return False
    return madvise(ctypes.c_void_p(start), end - start, MADV_HUGEPAGE) == 0


def lazy_zeros(nbytes: int, huge: bool = True) -> torch.Tensor:
    """A uint8 tensor of nbytes zeros whose pages the kernel maps on first write (so a multi-GiB
    buffer costs nothing until used). With `huge`, it starts on a 2 MiB boundary and its whole 2 MiB
    pages are advised huge before any is touched; without, it is never advised (NumPy advises every
    allocation over 4 MiB on its own: that is turned off around this one)."""
    if not huge or not huge_pages_wanted():
        with _numpy_advice(False):
            return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8))
    raw = torch.from_numpy(np.zeros(nbytes + HUGE_PAGE, dtype=np.uint8))
    offset = -raw.data_ptr() % HUGE_PAGE
    buf = raw[offset:offset + nbytes]
    advise_huge(buf.data_ptr(), nbytes)
    return buf


@contextlib.contextmanager
def _numpy_advice(enabled: bool):
    setter = getattr(getattr(np, "_core", np.core).multiarray, "_set_madvise_hugepage", None)
    if setter is None:
        yield
        return
    previous = setter(enabled)
    try:
        yield
    finally:
        setter(previous)


def populate(address: int, nbytes: int) -> bool:
    """Map [address, address + nbytes) writable now, contents untouched (safe while others write
    there); False where the kernel cannot (before 5.14, not Linux)."""
    madvise = _madvise()
    if madvise is None or nbytes <= 0:
        return False
    start = address - address % PAGE
    return madvise(ctypes.c_void_p(start), address + nbytes - start, MADV_POPULATE_WRITE) == 0


class Prefaulter:
    """Maps lazily allocated tensors (a KV cache) in a background thread at the lowest CPU priority,
    so requests do not pay the first write to each page: on machine B a fresh 2 MiB page cost up to
    ~2 ms, and the 60 K/V tensors of a model cross into new pages at the same step, which stalled
    that step by 0.3-0.6 s (docs/BENCHMARKS.md, "Huge pages"). Chunks go in block order across all
    tensors, since the engine hands out the lowest blocks first. `stop()` ends it between chunks."""

    def __init__(self, tensors: list[torch.Tensor], chunk_bytes: int = 32 << 20) -> None:
        self._spans = [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]
        self._tensors: list[torch.Tensor] | None = list(tensors)  # alive while the thread maps them
        self._chunk = chunk_bytes
        self._stop = threading.Event()
        self.mapped_bytes = 0
        self.supported = True
        self.thread = threading.Thread(target=self._run, name="tokenmill-kv-prefault", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only
        except (OSError, AttributeError):
            pass
        try:
            longest = max((n for _, n in self._spans), default=0)
            for offset in range(0, longest, self._chunk):
                for address, n in self._spans:
                    if self._stop.is_set():
                        return
                    if offset < n:
                        size = min(self._chunk, n - offset)
                        if not populate(address + offset, size):
                            self.supported = False
                            return
                        self.mapped_bytes += size
        finally:
            self._tensors = None

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.thread.join(timeout)


def anon_huge_bytes() -> int:
    """Bytes of this process's anonymous memory in huge pages now (-1: unknown)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return -1


def describe() -> str:
    """One line for the startup log."""
    if not huge_pages_wanted():
        return f"huge pages off ({HUGE_PAGES_ENV}=0)"
    mode = thp_mode()
    if mode not in ("always", "madvise"):
        return f"huge pages unavailable (transparent_hugepage: {mode})"
    have = anon_huge_bytes()
    return f"huge pages advised (transparent_hugepage: {mode}; {have / 2**20:.0f} MiB mapped huge now)" \
        if have >= 0 else f"huge pages advised (transparent_hugepage: {mode})"
