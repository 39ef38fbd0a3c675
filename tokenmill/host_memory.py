"""Host memory backed by transparent huge pages (2 MiB) where the kernel allows it.

Why: a decode step streams every weight once and reads KV blocks scattered over a multi-GiB cache.
With 4 KiB pages each 4 KiB of weights costs a TLB miss, and inside a VM a miss walks two page
tables. One 2 MiB page covers 512 of them: on machine B (a Firecracker VM) a batch-1 decode step of
the default model in bf16 ran 1.44-1.58x faster, a 16-row step 1.08x (`python -m
tokenmill.bench.host_pages`; docs/BENCHMARKS.md, "Huge pages for the weights").

How: most Linux servers set THP to `madvise` (only regions that ask get huge pages), and tensors
come from malloc, whose regions are not 2 MiB aligned and hold one tensor each (a 1 MiB weight can
never sit in a huge page). So we map one zero-filled region of our own (anonymous mmap, pages mapped
on first write), cut a 2 MiB aligned span out of it and `madvise(MADV_HUGEPAGE)` it before anything
touches it; the weight arena (models/weight_arena.py) is carved from such a span.

The KV cache (attention/kv_cache.py) takes such regions too but, by default, without the advice:
what a fresh huge page costs to map depends on the host. On machine B and on machine C one day it
was ~2 ms; on machine C the next day 20-40 ms (the hypervisor backing guest memory anew), so a
2.3 GiB cache took 20.5 s to map at `serve` start (0.7 s in 4 KiB pages) and an offline W1-48 run,
writing fresh cache pages as it goes, lost 15-20% of its throughput. The cache is written once per
page and read in blocks of tens of KiB, where huge pages gained ~2% on machine B; the weights are
mapped once, at load, and streamed whole every step. `TOKENMILL_HUGE_PAGES=all` advises the cache
too, `0` nothing (for A/B measurements).

Where THP is `never`, on a kernel without it, or off Linux, the advice fails quietly and the memory
is ordinary.

A first write to a page costs a fault, and every K/V tensor crosses into a new page at the same
step: `prefault` maps a cache before it serves (`tokenmill serve`). What a fault costs depends on the
host too: on machine C a first write cost 2.5-4.4 us per 4 KiB page, but 69-75 us right after another
large process (vLLM) had started and freed its memory, which the hypervisor had taken back; an
offline W1-200 run that mapped its cache as it filled spent 29 s in the kernel instead of 3 s.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23  # Linux 5.14+: map pages writable without writing them
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
HUGE_PAGES_ENV = "TOKENMILL_HUGE_PAGES"  # "0": never advise; "1" (default): the weights; "all": weights and KV cache
_THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def _setting() -> str:
    return os.environ.get(HUGE_PAGES_ENV, "1").strip().lower()


def huge_pages_wanted() -> bool:
    return _setting() not in ("0", "false", "no", "off")


def kv_huge_pages_wanted() -> bool:
    """Whether the KV cache is advised huge too: only with TOKENMILL_HUGE_PAGES=all (see the module
    docstring: a fresh huge page can cost 20-40 ms to map on a VM, and a cache fills with them)."""
    return _setting() == "all"


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
    pages are advised huge before any is touched; without, it is never advised.

    The memory is an anonymous mapping of its own, not an allocator's: tcmalloc's calloc (our
    engines run on tcmalloc, tokenmill/malloc.py) memsets what it hands out, which maps every page
    as 4 KiB before any advice could apply and costs the whole size at once; glibc's and NumPy's
    give no 2 MiB alignment. The mapping is unmapped when the last tensor on it goes."""
    if nbytes <= 0:
        return torch.zeros(0, dtype=torch.uint8)
    advise = huge and huge_pages_wanted()
    pad = HUGE_PAGE if advise else 0
    # private: Python's default for anonymous maps is MAP_SHARED (shmem, which gets no THP and which a
    # forked child would write through to)
    region = mmap.mmap(-1, nbytes + pad, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # the tensor keeps the mapping alive
    offset = -raw.data_ptr() % HUGE_PAGE if advise else 0
    buf = raw[offset:offset + nbytes]
    if advise:
        advise_huge(buf.data_ptr(), nbytes)
    return buf


def populate(address: int, nbytes: int) -> bool:
    """Map [address, address + nbytes) writable now, contents untouched (safe while others write
    there); False where the kernel cannot (before 5.14, not Linux)."""
    madvise = _madvise()
    if madvise is None or nbytes <= 0:
        return False
    start = address - address % PAGE
    return madvise(ctypes.c_void_p(start), address + nbytes - start, MADV_POPULATE_WRITE) == 0


@dataclass
class PrefaultResult:
    mapped_bytes: int
    seconds: float
    supported: bool  # False: the kernel has no MADV_POPULATE_WRITE, pages stay lazy


def prefault(tensors: list[torch.Tensor], threads: int = 1, chunk_bytes: int = 32 << 20) -> PrefaultResult:
    """Map lazily allocated tensors (a KV cache) now, so requests never pay the first write to a
    page: on machine B a fresh 2 MiB page cost ~2 ms, and the 60 K/V tensors of a model cross into
    new pages at the same step, which stalled that step by 0.3-0.7 s when the cache was in huge pages
    (docs/BENCHMARKS.md, "Huge pages"). In 4 KiB pages (the default) each fault is cheaper, but
    there are 512 times as many. Done before serving: mapped from a background thread while requests
    ran, the first requests waited 0.5-1.8 s on it. Chunks in block order across tensors, over `threads` threads
    (the madvise calls release the GIL)."""
    spans = [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]
    longest = max((n for _, n in spans), default=0)
    chunks = [(a + off, min(chunk_bytes, n - off)) for off in range(0, longest, chunk_bytes) for a, n in spans
              if off < n]
    start = time.perf_counter()
    if not chunks or not populate(*chunks[0]):
        return PrefaultResult(0, time.perf_counter() - start, supported=not chunks)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        done = list(pool.map(lambda c: populate(*c), chunks[1:]))
    mapped = chunks[0][1] + sum(size for (_, size), ok in zip(chunks[1:], done) if ok)
    return PrefaultResult(mapped, time.perf_counter() - start, supported=True)


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
    mapped = f"; {have / 2**20:.0f} MiB mapped huge now" if have >= 0 else ""
    if kv_huge_pages_wanted():
        return f"huge pages advised for the weights and KV cache (transparent_hugepage: {mode}{mapped})"
    return (f"huge pages advised for the weights (transparent_hugepage: {mode}{mapped}); "
            f"KV cache in 4 KiB pages ({HUGE_PAGES_ENV}=all for both)")
