"""The allocator an engine process runs on (tokenmill/malloc.py): when `tokenmill` re-executes
itself with tcmalloc preloaded, and that it really runs on it afterwards."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokenmill import malloc

REPO = Path(__file__).resolve().parents[1]
LIB = "/opt/lib/libtcmalloc_minimal.so.4"


@pytest.mark.parametrize("command", sorted(malloc.ENGINE_COMMANDS))
def test_engine_commands_reexecute_with_tcmalloc_first_in_the_preload(command):
    env = malloc.reexec_env(command, {"LD_PRELOAD": "/x/libiomp5.so", "PATH": "/bin"}, lambda: LIB)
    assert env == {"LD_PRELOAD": f"{LIB}:/x/libiomp5.so", "PATH": "/bin", "TOKENMILL_MALLOC_REEXECUTED": "1"}


@pytest.mark.parametrize("command, env, library", [
    ("fleet", {}, LIB),                                        # no engine in this process
    (None, {}, LIB),                                           # `tokenmill --version`
    ("serve", {"TOKENMILL_MALLOC": "system"}, LIB),            # asked for the C library's
    ("serve", {"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"}, LIB),  # already preloaded
    ("serve", {"TOKENMILL_MALLOC_REEXECUTED": "1"}, LIB),      # re-executed once already: never loop
    ("serve", {}, None),                                       # not installed: run on
])
def test_no_reexecution(command, env, library):
    assert malloc.reexec_env(command, env, lambda: library) is None


def test_the_library_is_looked_for_only_when_it_decides():
    def never() -> str:
        raise AssertionError("looked for tcmalloc")
    for command, env in (("fleet", {}), ("serve", {"TOKENMILL_MALLOC": "system"}),
                         ("serve", {"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"})):
        assert malloc.reexec_env(command, env, never) is None


def test_required_tcmalloc_that_is_missing_and_a_bad_value_are_errors():
    with pytest.raises(ValueError, match="TOKENMILL_MALLOC=tcmalloc but no tcmalloc library was found"):
        malloc.reexec_env("serve", {"TOKENMILL_MALLOC": "tcmalloc"}, lambda: None)
    with pytest.raises(ValueError, match="TOKENMILL_MALLOC must be one of auto, tcmalloc, system; got 'fast'"):
        malloc.reexec_env("serve", {"TOKENMILL_MALLOC": "fast"}, lambda: LIB)
    assert malloc.reexec_env("fleet", {"TOKENMILL_MALLOC": "fast"}, lambda: LIB) is None  # only engine commands read it


def _generate(tiny_llama, **env):
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    full.pop("LD_PRELOAD", None)
    return subprocess.run([sys.executable, "-m", "tokenmill", "generate", "Hello", "--model", str(tiny_llama),
                           "--max-tokens", "3", "--dtype", "float32", "--kv-cache-memory-gb", "0.01", "--num-threads",
                           "1", "--temperature", "0"], capture_output=True, text=True, timeout=300, env=full, cwd=REPO)


@pytest.mark.skipif(malloc.find_tcmalloc() is None, reason="tcmalloc is not installed (libtcmalloc-minimal4)")
def test_generate_runs_on_tcmalloc_and_gives_the_same_tokens(tiny_llama):
    on, off = _generate(tiny_llama), _generate(tiny_llama, TOKENMILL_MALLOC="system")
    assert on.returncode == 0 and off.returncode == 0, on.stderr + off.stderr
    assert "memory allocator: tcmalloc" in on.stderr  # read from the process's own memory map
    assert "memory allocator: the C library's malloc (for tcmalloc, as vLLM runs: LD_PRELOAD=" in off.stderr
    assert on.stdout == off.stdout


def test_a_bad_setting_is_one_line_before_anything_loads(tmp_path):
    run = subprocess.run([sys.executable, "-m", "tokenmill", "serve", str(tmp_path)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO), "TOKENMILL_MALLOC": "fast"})
    assert run.returncode == 2
    assert run.stderr == "tokenmill: error: TOKENMILL_MALLOC must be one of auto, tcmalloc, system; got 'fast'\n"
