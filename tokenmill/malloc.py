"""The memory allocator an engine process runs on (torch-free: read before anything heavy loads).

Every op of a step allocates its output, and the large ones (a prefill chunk's MLP activations, the
logits) are megabytes. vLLM's CPU backend asks its users to preload tcmalloc by hand, and every
comparison runs vLLM so; `tokenmill` commands that run an engine re-execute themselves once with
tcmalloc preloaded where the machine has it (Debian/Ubuntu package libtcmalloc-minimal4; gperftools
elsewhere), so the two engines compare like for like. A speed gain of its own is not shown: W1-48
ran 0.96x and 1.13x glibc's in two alternated rounds (docs/BENCHMARKS.md, "The memory allocator";
the 1.12x first reported there was huge pages, which tcmalloc's calloc had silently disabled).

TOKENMILL_MALLOC: `auto` (the default: tcmalloc where installed), `tcmalloc` (required: an error
without it), `system` (the C library's malloc). A Python program using `LLM()` sets `LD_PRELOAD`
itself; the engine logs which allocator it runs on and, on glibc's, the line to use.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

ENV = "TOKENMILL_MALLOC"
CHOICES = ("auto", "tcmalloc", "system")
_REEXECUTED = "TOKENMILL_MALLOC_REEXECUTED"  # set in the re-executed process: never loop
# the `tokenmill` commands that run an engine in their own process
ENGINE_COMMANDS = frozenset({"generate", "chat", "serve", "serve-multi", "eval", "bench", "quantize"})
_CANDIDATES = ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
               "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib64/libtcmalloc_minimal.so.4",
               "/usr/lib64/libtcmalloc.so.4", "/usr/local/lib/libtcmalloc_minimal.so.4")


def choice(env: dict[str, str]) -> str:
    value = env.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV} must be one of {', '.join(CHOICES)}; got {env[ENV]!r}")
    return value


def find_tcmalloc() -> str | None:
    """A tcmalloc shared library's path, or None."""
    for path in _CANDIDATES:
        if Path(path).is_file():
            return path
    for name in ("tcmalloc_minimal", "tcmalloc"):
        found = ctypes.util.find_library(name)  # a soname the loader finds in its standard paths
        if found:
            return found
    return None


def preloaded(env: dict[str, str]) -> bool:
    return "tcmalloc" in env.get("LD_PRELOAD", "")


def reexec_env(command: str | None, env: dict[str, str],
               find: Callable[[], str | None] = find_tcmalloc) -> dict[str, str] | None:
    """The environment to re-execute `tokenmill COMMAND` in, or None to run on as it is (`find` is
    called only when the answer depends on it: its ldconfig fallback costs a subprocess)."""
    if command not in ENGINE_COMMANDS:
        return None
    wanted = choice(env)
    if wanted == "system" or preloaded(env) or env.get(_REEXECUTED):
        return None
    library = find()
    if library is None:
        if wanted == "tcmalloc":
            raise ValueError(f"{ENV}=tcmalloc but no tcmalloc library was found (install libtcmalloc-minimal4, or "
                             f"set {ENV}=system)")
        return None
    preload = ":".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)
    return {**env, "LD_PRELOAD": preload, _REEXECUTED: "1"}


def reexec_with_tcmalloc(command: str | None) -> None:
    """Called first by an entry point that runs `tokenmill COMMAND` (the CLI, `python -m
    tokenmill.server`, benchmark scripts): replaces this process by the same invocation with tcmalloc
    preloaded when reexec_env says so; returns otherwise. A bad TOKENMILL_MALLOC ends the process with
    a one-line error."""
    try:
        new_env = reexec_env(command, dict(os.environ))
    except ValueError as e:
        print(f"tokenmill: error: {e}", file=sys.stderr)
        sys.exit(2)
    if new_env is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        # the same command line, the interpreter's own options included (`-X ...`, then `-m MODULE
        # ARGS` or `SCRIPT ARGS`)
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], new_env)


def active() -> str:
    """The allocator this process runs on: "tcmalloc" when its library is mapped, else "system"."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "tcmalloc" if preloaded(dict(os.environ)) else "system"
    return "tcmalloc" if "libtcmalloc" in maps else "system"


def describe() -> str:
    """One line for the start-up log."""
    if active() == "tcmalloc":
        return "memory allocator: tcmalloc"
    library = find_tcmalloc()
    if library is None:
        return "memory allocator: the C library's malloc (tcmalloc, which vLLM runs on, is not installed)"
    return f"memory allocator: the C library's malloc (for tcmalloc, as vLLM runs: LD_PRELOAD={library})"


def release_free_memory() -> None:
    """Give freed heap back to the OS (after loading: the float copies of repacked weights), so the
    resident size is the model's."""
    try:
        if active() == "tcmalloc":
            ctypes.CDLL(None).MallocExtension_ReleaseFreeMemory()
        else:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # neither glibc nor gperftools' tcmalloc
        pass
