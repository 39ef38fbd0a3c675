"""The server's tokenizer pool: each thread owns its own tokenizer, and the ids match the engine's."""
from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).parent / "e2e"))

from e2e_helpers import TINY_CHAT_TEMPLATE  # noqa: E402

from tokenmill.server.tokenization import PromptError, PromptTokenizer  # noqa: E402

MESSAGES = [{"role": "user", "content": "Hello there"}]


@pytest.fixture
def engine_tokenizer(tiny_llama):
    return AutoTokenizer.from_pretrained(str(tiny_llama))


def test_each_thread_owns_a_distinct_tokenizer(engine_tokenizer):
    pool = PromptTokenizer(engine_tokenizer.name_or_path, num_threads=2)
    barrier = threading.Barrier(2, timeout=30)

    def probe(tok):
        barrier.wait()  # both calls at once: they must be in the two different threads
        return threading.get_ident(), tok

    async def main():
        return await asyncio.gather(pool.run(probe), pool.run(probe))

    try:
        (t1, tok1), (t2, tok2) = asyncio.run(main())
    finally:
        pool.shutdown()
    assert t1 != t2 and threading.get_ident() not in (t1, t2)
    rust = [tok1.backend_tokenizer, tok2.backend_tokenizer, engine_tokenizer.backend_tokenizer]
    assert len({id(r) for r in rust}) == 3  # three distinct Rust tokenizer objects


def test_ids_match_the_engine_tokenizer(engine_tokenizer):
    pool = PromptTokenizer(engine_tokenizer.name_or_path, TINY_CHAT_TEMPLATE)
    texts = ["Hello world", "Rocket 🚀 and 你好", "x"]

    async def main():
        return await pool.encode(texts), await pool.chat_prompt(MESSAGES, True, {})

    try:
        encoded, chat = asyncio.run(main())
    finally:
        pool.shutdown()
    assert encoded == [engine_tokenizer.encode(t, add_special_tokens=True) for t in texts]
    ids = engine_tokenizer.apply_chat_template(MESSAGES, chat_template=TINY_CHAT_TEMPLATE, tokenize=True,
                                               add_generation_prompt=True)
    assert chat == list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.mark.parametrize("template, message", [("{% for %}", "cannot apply the chat template"),
                                               ("{{ '' }}", "empty prompt")])
def test_bad_chat_template_is_a_prompt_error(engine_tokenizer, template, message):
    pool = PromptTokenizer(engine_tokenizer.name_or_path, template)
    try:
        with pytest.raises(PromptError, match=message):
            asyncio.run(pool.chat_prompt(MESSAGES, True, {}))
    finally:
        pool.shutdown()
