"""Tool definitions -> what the model sees and what it may write.

Prompt: a chat template that knows tools (it mentions `tools`) gets them as `tools=`; any other
(SmolLM2-135M-Instruct's among them) gets the documented fallback: a system block listing the
functions as JSON and asking for Hermes-style calls, `<tool_call>{"name": ..., "arguments": ...}
</tool_call>`; earlier assistant tool calls are written back in that form and tool results become
user turns wrapped in `<tool_response>`. Output: with tool_choice "required" or a named function,
a Lark grammar forces one or more such blocks whose arguments follow each function's schema.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tokenmill.structured.backend import COMPACT_JSON

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

FALLBACK_SYSTEM = (
    "You are a function calling AI model. You may call one or more functions to assist with the user query. "
    "Here are the available functions:\n<tools>\n{tools}\n</tools>\n"
    "To call a function, answer with one block per call, each holding a JSON object with the function name "
    "and its arguments:\n" + TOOL_CALL_START + '\n{{"name": <function-name>, "arguments": <arguments-object>}}\n'
    + TOOL_CALL_END)


class ToolError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "none", "auto", "required" or "named"
    name: str | None = None  # the function, when named

    @property
    def constrained(self) -> bool:
        return self.mode in ("required", "named")


def check_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's tools, checked (each {"type": "function", "function": {"name": ..., ...}})."""
    names = set()
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}", "tools")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ToolError(f"tools[{i}].function.name must be a non-empty string", "tools")
        if name in names:
            raise ToolError(f"tools[{i}].function.name {name!r} is used twice", "tools")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        names.add(name)
    return list(tools or [])


def parse_tool_choice(choice: Any, tools: list[dict[str, Any]]) -> ToolChoice:
    """OpenAI's tool_choice: "none", "auto" (the default with tools), "required", or
    {"type": "function", "function": {"name": ...}}."""
    if choice is None:
        return ToolChoice("auto" if tools else "none")
    if choice in ("none", "auto", "required"):
        if choice != "none" and not tools:
            raise ToolError(f"tool_choice {choice!r} needs tools", "tool_choice")
        return ToolChoice(choice)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise ToolError('tool_choice must be "none", "auto", "required" or {"type": "function", '
                        '"function": {"name": ...}}', "tool_choice")
    if name not in tool_names(tools):
        raise ToolError(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")
    return ToolChoice("named", name)


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def tool_call_grammar(tools: list[dict[str, Any]], choice: ToolChoice, parallel: bool) -> str:
    """Lark grammar: one (or, with parallel calls, several newline-separated) tool-call blocks,
    each naming one of the allowed functions with arguments that follow its schema."""
    allowed = [t for t in tools if choice.mode != "named" or t["function"]["name"] == choice.name]
    rules, alts = [], []
    for i, tool in enumerate(allowed):
        fn = tool["function"]
        schema = dict(fn.get("parameters") or {"type": "object"})
        schema.setdefault("x-guidance", COMPACT_JSON)
        head = f'{TOOL_CALL_START}\n{{"name": {json.dumps(fn["name"], ensure_ascii=False)}, "arguments": '
        rules.append(f"call_{i}: {_lit(head)} args_{i} {_lit('}' + chr(10) + TOOL_CALL_END)}")
        rules.append(f"args_{i}: %json {json.dumps(schema, ensure_ascii=False)}")
        alts.append(f"call_{i}")
    top = 'start: call ("\\n" call)*' if parallel and choice.mode != "named" else "start: call"
    return "\n".join([top, "call: " + " | ".join(alts), *rules])


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def template_supports_tools(template: str | None) -> bool:
    return bool(template) and "tools" in template


def needs_fallback(messages: list[dict], tools: list[dict] | None, template: str | None) -> bool:
    uses_tools = bool(tools) or any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
    return uses_tools and not template_supports_tools(template)


def fallback_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Messages for a template without tool support: tools described in the system message,
    assistant tool calls written as blocks, tool results as user turns."""
    out = []
    for m in messages:
        if m.get("role") == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{_text(m.get('content'))}\n</tool_response>"})
        elif m.get("tool_calls"):
            blocks = [format_call(c["function"]["name"], c["function"].get("arguments") or "{}")
                      for c in m["tool_calls"]]
            text = "\n".join(([_text(m["content"])] if m.get("content") else []) + blocks)
            out.append({"role": m["role"], "content": text})
        else:
            out.append({**m, "content": _text(m.get("content"))})
    if tools:
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        block = FALLBACK_SYSTEM.format(tools=listing)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def format_call(name: str, arguments: str) -> str:
    """One call as the fallback format and the grammar write it."""
    return f'{TOOL_CALL_START}\n{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {arguments}}}\n{TOOL_CALL_END}'


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "" if content is None else str(content)
