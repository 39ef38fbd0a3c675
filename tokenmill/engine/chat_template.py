"""Chat messages -> prompt token ids through the model's chat template (the server and LLM.chat).

A template that cannot render tool calls or tool results gets them as text (structured/tools.py's
fallback); OpenAI-style content parts are joined into one string for templates that expect text."""
from __future__ import annotations

from typing import Any

from tokenmill.structured.tools import fallback_messages, needs_fallback


class PromptError(ValueError):
    """The messages cannot be turned into a prompt (bad template, empty result)."""


def join_text_parts(messages: list[dict]) -> list[dict]:
    """[{"type": "text", "text": ...}, ...] content as one string (vLLM's "string" content format)."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            texts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise PromptError(f"messages[{i}].content: only text parts are supported, got {kind!r}")
                texts.append(part["text"])
            m = {**m, "content": "".join(texts)}
        out.append(m)
    return out


def apply_chat_template(tok, messages: list[dict], chat_template: str | None, add_generation_prompt: bool,
                        template_kwargs: dict[str, Any], tools: list[dict] | None = None) -> list[int]:
    if needs_fallback(messages, tools, chat_template or getattr(tok, "chat_template", None)):
        messages, tools = fallback_messages(messages, tools), None  # structured/tools.py: the fallback
    if tools:
        template_kwargs = {**template_kwargs, "tools": tools}
    try:
        ids = tok.apply_chat_template(messages, chat_template=chat_template, tokenize=True,
                                      add_generation_prompt=add_generation_prompt, **template_kwargs)
    except Exception as e:
        hint = "" if getattr(tok, "chat_template", None) or chat_template else \
            " (this model's tokenizer has no chat template: give one, --chat-template or chat_template=)"
        raise PromptError(f"cannot apply the chat template: {e}{hint}") from None
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    ids = list(ids)
    if ids and isinstance(ids[0], list):  # some tokenizers return a batch of one
        ids = ids[0]
    if not ids:
        raise PromptError("the chat template produced an empty prompt")
    return ids
