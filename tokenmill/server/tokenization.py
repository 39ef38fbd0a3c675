"""Chat templates and text prompts -> token ids, off the event loop and off the engine thread.

A Hugging Face fast tokenizer wraps one Rust object that two threads must not use at once (it
fails with "Already borrowed"). The engine thread owns the engine's tokenizer; the server
tokenizes in a small thread pool whose threads each load their own tokenizer from the same folder,
and hands the engine token ids.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tokenmill.engine.chat_template import PromptError, apply_chat_template
from tokenmill.engine.tokenizer import load_tokenizer

T = TypeVar("T")

TOKENIZER_THREADS = 2


class PromptTokenizer:
    """Tokenizes in `num_threads` threads, each with its own tokenizer loaded from `name_or_path`."""

    def __init__(self, name_or_path: str, chat_template: str | None = None,
                 num_threads: int = TOKENIZER_THREADS) -> None:
        self.name_or_path = name_or_path
        self.chat_template = chat_template
        self.num_threads = num_threads
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="tokenmill-tokenizer")
        self._local = threading.local()

    def _tokenizer(self):
        """This pool thread's own tokenizer (loaded on its first use)."""
        tok = getattr(self._local, "tokenizer", None)
        if tok is None:
            tok = self._local.tokenizer = load_tokenizer(self.name_or_path)
        return tok

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(tokenizer, *args)` in a pool thread, with that thread's tokenizer."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(self._tokenizer(), *args))

    async def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, with the tokenizer's special tokens (as the engine would)."""
        return await self.run(_encode, texts)

    async def chat_prompt(self, messages: list[dict], add_generation_prompt: bool,
                          template_kwargs: dict[str, Any], tools: list[dict] | None = None) -> list[int]:
        """Token ids of the chat template applied to `messages` (and `tools`); raises PromptError."""
        return await self.run(apply_chat_template, messages, self.chat_template, add_generation_prompt,
                              template_kwargs, tools)

    async def decode(self, token_ids: list[int]) -> str:
        return await self.run(lambda tok, ids: tok.decode(ids), token_ids)

    async def token_strs(self, token_ids: list[int]) -> list[str]:
        return await self.run(lambda tok, ids: tok.convert_ids_to_tokens(ids), token_ids)

    def warm_up(self) -> None:
        """Start loading the threads' tokenizers now rather than on the first requests."""
        for _ in range(self.num_threads):  # usually one per thread (best effort)
            self._pool.submit(self._tokenizer)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _encode(tok, texts: list[str]) -> list[list[int]]:
    return [tok.encode(text, add_special_tokens=True) for text in texts]
