"""Tool calling pieces without a model: tool_choice, the call grammar, the fallback prompt, and
the parser (whole and streamed)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.structured.tool_parser import ToolCallStream, parse_tool_calls, response_content
from tokenmill.structured.tools import (
    ToolChoice,
    ToolError,
    check_tools,
    fallback_messages,
    format_call,
    needs_fallback,
    parse_tool_choice,
    tool_call_grammar,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
NAMES = {"get_weather", "get_time"}


def test_tool_choice_forms_and_errors():
    tools = [WEATHER, TIME]
    assert parse_tool_choice(None, tools) == ToolChoice("auto")
    assert parse_tool_choice(None, []) == ToolChoice("none")
    assert parse_tool_choice("required", tools).constrained
    assert parse_tool_choice({"type": "function", "function": {"name": "get_time"}}, tools) == ToolChoice("named",
                                                                                                          "get_time")
    with pytest.raises(ToolError, match="not in tools"):
        parse_tool_choice({"type": "function", "function": {"name": "nope"}}, tools)
    with pytest.raises(ToolError, match="needs tools"):
        parse_tool_choice("required", [])
    with pytest.raises(ToolError, match="used twice"):
        check_tools([WEATHER, WEATHER])
    with pytest.raises(ToolError, match="name"):
        check_tools([{"type": "function", "function": {}}])


def test_call_grammar_accepts_exactly_the_call_format():
    from llguidance import LLMatcher

    grammar = tool_call_grammar([WEATHER, TIME], ToolChoice("required"), parallel=True)
    good = format_call("get_weather", '{"city": "Paris"}') + "\n" + format_call("get_time", "{}")
    err, messages = LLMatcher.validate_grammar_with_warnings(LLMatcher.grammar_from_lark(grammar))
    assert not err, messages
    interp = _byte_matcher(grammar)
    assert interp(good)
    assert not interp(format_call("get_weather", '{"town": 3}'))  # city is required, a string
    assert not interp(format_call("other", "{}"))
    named = _byte_matcher(tool_call_grammar([WEATHER, TIME], ToolChoice("named", "get_time"), parallel=True))
    assert named(format_call("get_time", "{}")) and not named(format_call("get_weather", '{"city": "x"}'))
    assert not named(format_call("get_time", "{}") + "\n" + format_call("get_time", "{}"))


def _byte_matcher(lark: str):
    """Whether text is a complete sentence of the grammar (byte-level tokenizer: no model needed)."""
    import llguidance.hf
    from llguidance import LLMatcher
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    vocab["</s>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")
    lltok = llguidance.hf.from_tokenizer(fast)

    def accepts(text: str) -> bool:
        m = LLMatcher(lltok, LLMatcher.grammar_from_lark(lark), log_level=0)
        return all(m.consume_token(t) for t in fast.encode(text)) and m.is_accepting()

    return accepts


def test_fallback_prompt_lists_tools_and_rewrites_history():
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 3}'}]
    assert needs_fallback(messages, None, "{{ messages }}")
    assert not needs_fallback(messages, [WEATHER], "{% if tools %}...{% endif %}")
    out = fallback_messages(messages, [WEATHER])
    assert out[0]["role"] == "system" and '"get_weather"' in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": format_call("get_weather", '{"city": "Oslo"}')}
    assert out[3] == {"role": "user", "content": '<tool_response>\n{"temp": 3}\n</tool_response>'}


def test_parse_calls_content_and_malformed_blocks():
    text = ("Sure.\n" + format_call("get_weather", '{"city": "Rome"}') + "\n"
            + format_call("get_time", "{}") + "\n<tool_call>\n{broken}\n</tool_call>")
    parsed = parse_tool_calls(text, NAMES)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("get_weather", {"city": "Rome"}),
                                                                         ("get_time", {})]
    assert parsed.content == "Sure.\n\n\n<tool_call>\n{broken}\n</tool_call>"
    only_calls = parse_tool_calls(format_call("get_time", "{}"), NAMES)
    assert response_content(only_calls) is None and len(only_calls.calls) == 1
    unknown = parse_tool_calls(format_call("rm_rf", "{}"), NAMES)
    assert not unknown.calls and unknown.content == format_call("rm_rf", "{}")
    cut = parse_tool_calls('<tool_call>\n{"name": "get_time", "arguments": {}}', NAMES)  # EOS before the end tag
    assert [c.name for c in cut.calls] == ["get_time"]


SEGMENTS = st.sampled_from(["Hi ", " ", "\n", "<tool", "_call>", "text <", format_call("get_weather", '{"city": "a"}'),
                            format_call("get_time", "{}"), "<tool_call>\n{bad}\n</tool_call>", "</tool_call>"])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(SEGMENTS, max_size=8), st.data())
def test_streamed_pieces_reassemble_to_the_whole_parse(segments, data):
    text = "".join(segments)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6)))
    stream = ToolCallStream(NAMES)
    content, calls = "", []
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    so_far = ""
    for i, piece in enumerate(pieces):
        so_far += piece
        c, new = stream.update(so_far, final=i == len(pieces) - 1)
        content += c
        calls += [call for _, call in new]
    whole = parse_tool_calls(text, NAMES)
    assert (content or None) == response_content(whole)
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole.calls]
