import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# The suite's engines keep their weights in 4 KiB pages unless the runner asks otherwise: on a VM whose
# balloon reports free memory (as ours and CI's do) a fresh 2 MiB page costs ~20 ms to map, 6-8 s for the
# default model's float32 arena (625 MiB), paid again by every engine and server the suite starts (25 s of 139 s
# on seven of its test files, 2026-12-02). The huge-page path keeps its own tests (test_host_memory.py
# sets and clears the variable itself); TOKENMILL_HUGE_PAGES=1 runs the whole suite with it.
os.environ.setdefault("TOKENMILL_HUGE_PAGES", "0")

from tiny_models import make_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny_llama"), "llama", seed=1)


@pytest.fixture(scope="session")
def tiny_llm(tiny_llama):
    """A float32 engine on the tiny Llama, shared by tests that only generate."""
    from tokenmill import LLM
    return LLM(str(tiny_llama), dtype="float32", kv_cache_memory_gb=0.02)


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    from tokenmill.models.default_model import resolve_default_model
    return resolve_default_model()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_folder):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(smollm2_folder)


@pytest.fixture(scope="session", autouse=True)
def user_cache_untouched():
    """Tests convert their own .gguf files into temporary caches: the user's cache gains nothing but
    the default model's folder and index (which the suite reuses, run after run)."""
    from tokenmill.models.default_model import DEFAULT_MODEL_NAME
    from tokenmill.models.gguf_convert import default_cache_dir
    folder = default_cache_dir() / "gguf"
    before = set(folder.iterdir()) if folder.is_dir() else set()
    yield
    added = set(folder.iterdir()) - before if folder.is_dir() else set()
    left = sorted(p.name for p in added if not p.name.startswith(DEFAULT_MODEL_NAME) and not p.name.startswith("."))
    assert not left, f"tests left converted models in the user's cache {folder}: {left}"
