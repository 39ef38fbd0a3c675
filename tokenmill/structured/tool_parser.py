"""Model output -> content and tool calls (Hermes-style `<tool_call>{json}</tool_call>` blocks),
whole or incrementally for streaming.

A block whose JSON names a known function becomes a call; anything else stays content. While
streaming, a block is reported once it is complete (at the end, an unterminated block whose JSON
is complete counts too), and text that might be the start of a block is held back, so the streamed
content and calls put together equal the parse of the whole text.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from tokenmill.structured.tools import TOOL_CALL_END, TOOL_CALL_START


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI's function.arguments
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedOutput:
    content: str  # the text outside tool-call blocks
    calls: list[ToolCall]


def parse_tool_calls(text: str, names: set[str], final: bool = True) -> ParsedOutput:
    """`final=False`: the text may go on, so hold back an unterminated block and a possible
    partial `<tool_call>` at the end."""
    content, calls, pos = [], [], 0
    while True:
        start = text.find(TOOL_CALL_START, pos)
        if start < 0:
            tail = text[pos:]
            content.append(tail if final else tail[: len(tail) - _partial_tag(tail)])
            break
        content.append(text[pos:start])
        end = text.find(TOOL_CALL_END, start)
        stop = len(text) if end < 0 else end + len(TOOL_CALL_END)
        if end < 0 and not final:
            break
        call = _call(text[start + len(TOOL_CALL_START): end if end >= 0 else len(text)], names)
        if call is None:
            content.append(text[start:stop])
        else:
            calls.append(call)
        pos = stop
    return ParsedOutput("".join(content), calls)


def _partial_tag(text: str) -> int:
    """Length of the longest suffix of text that begins TOOL_CALL_START."""
    for n in range(min(len(text), len(TOOL_CALL_START) - 1), 0, -1):
        if TOOL_CALL_START.startswith(text[-n:]):
            return n
    return 0


def _call(block: str, names: set[str]) -> ToolCall | None:
    try:
        obj = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallStream:
    """One choice's streamed output: `update(text, final)` with the whole text so far returns the
    new content and the calls completed since the last update. Content that is only whitespace is
    never sent (the whole response's content is then null)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.sent_content = 0
        self.sent_calls = 0

    def update(self, text: str, final: bool) -> tuple[str, list[tuple[int, ToolCall]]]:
        parsed = parse_tool_calls(text, self.names, final)
        content = ""
        if self.sent_content or parsed.content.strip():
            content = parsed.content[self.sent_content:]
            self.sent_content = len(parsed.content)
        new = list(enumerate(parsed.calls))[self.sent_calls:]
        self.sent_calls = len(parsed.calls)
        return content, new


def response_content(parsed: ParsedOutput) -> str | None:
    return parsed.content if parsed.content.strip() else None
