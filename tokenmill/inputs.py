"""vLLM's prompt types (`from vllm.inputs import TokensPrompt` becomes `from tokenmill.inputs import
TokensPrompt`): plain dicts, as LLM.generate and LLMEngine.add_request take them."""
from __future__ import annotations

from typing import TypedDict

try:
    from typing import NotRequired
except ImportError:  # Python 3.10
    from typing_extensions import NotRequired


class TextPrompt(TypedDict):
    prompt: str


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]
    prompt: NotRequired[str]  # kept for the output; the ids are what runs


PromptType = str | list[int] | TextPrompt | TokensPrompt
