"""Tool calling on /v1/chat/completions: the request's tools and tool_choice, the constraint they
put on the output, and the assistant message or streamed deltas carrying `tool_calls`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenmill.sampling_params import StructuredOutputsParams
from tokenmill.server.errors import APIError
from tokenmill.server.protocol import ChatCompletionRequest
from tokenmill.structured.tool_parser import ToolCallStream, parse_tool_calls, response_content
from tokenmill.structured.tools import (
    ToolChoice,
    ToolError,
    check_tools,
    parse_tool_choice,
    tool_call_grammar,
    tool_names,
)


@dataclass
class ChatTools:
    tools: list[dict[str, Any]]
    choice: ToolChoice
    parallel: bool
    names: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.names = set(tool_names(self.tools))

    @classmethod
    def of(cls, req: ChatCompletionRequest) -> ChatTools:
        try:
            tools = check_tools(req.tools)
            return cls(tools, parse_tool_choice(req.tool_choice, tools), req.parallel_tool_calls)
        except ToolError as e:
            raise APIError(400, str(e), param=e.param) from None

    @property
    def active(self) -> bool:
        """Whether the output is parsed for tool calls (tools given and tool_choice is not "none")."""
        return self.choice.mode != "none"

    @property
    def prompt_tools(self) -> list[dict[str, Any]] | None:
        return self.tools if self.active else None

    def constraint(self) -> StructuredOutputsParams | None:
        if not self.choice.constrained:
            return None
        return StructuredOutputsParams(grammar=tool_call_grammar(self.tools, self.choice, self.parallel))

    def message(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """The assistant message for a whole output, and the finish reason ("tool_calls" when the
        model stopped after calling)."""
        if not self.active:
            return {"role": "assistant", "content": text}, finish_reason
        parsed = parse_tool_calls(text, self.names)
        message: dict[str, Any] = {"role": "assistant", "content": response_content(parsed)}
        if parsed.calls:
            message["tool_calls"] = [c.to_openai() for c in parsed.calls]
        return message, _finish_reason(bool(parsed.calls), finish_reason)


class ToolDeltas:
    """One choice's stream: text deltas in, OpenAI deltas (content and tool_calls) out."""

    def __init__(self, tools: ChatTools) -> None:
        self.stream = ToolCallStream(tools.names)
        self.text = ""
        self.any_calls = False

    def update(self, delta_text: str, finish_reason: str | None) -> tuple[list[dict], str | None]:
        self.text += delta_text
        content, calls = self.stream.update(self.text, final=finish_reason is not None)
        deltas: list[dict] = [{"content": content}] if content else []
        for index, call in calls:
            deltas.append({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                           "function": {"name": call.name, "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})
        self.any_calls = self.any_calls or bool(calls)
        return deltas, _finish_reason(self.any_calls, finish_reason)


def _finish_reason(called: bool, finish_reason: str | None) -> str | None:
    return "tool_calls" if called and finish_reason == "stop" else finish_reason
