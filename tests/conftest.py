import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

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
