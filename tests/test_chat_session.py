"""ChatSession (the engine side of `tokenmill chat`) and ChatRepl's line handling, in process: a
scripted engine makes streaming and interruption deterministic; one test runs the tiny model."""
from __future__ import annotations

import builtins
import io

import pytest

from tokenmill.chat_session import ChatSession
from tokenmill.cli_chat import ChatRepl
from tokenmill.request import CompletionOutput, RequestOutput
from tokenmill.sampling_params import SamplingParams


class ScriptedTokenizer:
    """One token per word of every message; records the conversations it was given."""

    def __init__(self) -> None:
        self.seen: list[list[dict]] = []

    def apply_chat_template(self, messages, chat_template=None, tokenize=True, add_generation_prompt=True):
        self.seen.append([dict(m) for m in messages])
        return [1] * sum(len(m["content"].split()) + 1 for m in messages)


class ScriptedEngine:
    """Each step adds the next piece of `pieces` to the one request; the last piece finishes it."""

    def __init__(self, pieces: list[str], finish_reason: str = "stop", max_model_len: int = 100) -> None:
        self.tokenizer = ScriptedTokenizer()
        self.pieces, self.finish_reason = pieces, finish_reason
        self.max_model_len, self.kv_capacity_tokens = max_model_len, 10_000
        self.stream_outputs = False
        self.requests: dict[str, tuple[list[int], SamplingParams]] = {}
        self.aborted: list[str] = []
        self.steps = 0
        self._done = 0

    def next_request_id(self) -> str:
        return f"r{len(self.requests)}"

    def add_request(self, rid, prompt, params) -> None:
        self.requests[rid] = (prompt["prompt_token_ids"], params)
        self.current, self._done = rid, 0

    def abort_request(self, rid) -> None:
        self.aborted.append(rid)
        self.current = None

    def has_unfinished_requests(self) -> bool:
        return self.current is not None

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        self._done += 1
        last = self._done == len(self.pieces)
        text = "".join(self.pieces[:self._done])
        out = CompletionOutput(0, text, list(range(self._done)), finish_reason=self.finish_reason if last else None)
        rid = self.current
        if last:
            self.current = None
        return [RequestOutput(rid, None, [], None, [out], finished=last)]


def _session(pieces, **kw) -> tuple[ChatSession, ScriptedEngine]:
    engine = ScriptedEngine(pieces, **{k: v for k, v in kw.items() if k in ("finish_reason", "max_model_len")})
    params = kw.get("params", SamplingParams(max_tokens=None))
    return ChatSession(engine, params, system=kw.get("system")), engine


def test_reply_streams_piece_by_piece():
    session, engine = _session(["Hel", "lo", " there"])
    writes: list[tuple[str, int]] = []
    reply = session.send("hi", lambda text: writes.append((text, engine.steps)), lambda: False)
    assert engine.stream_outputs is True
    assert writes == [("Hel", 1), ("lo", 2), (" there", 3)]  # each piece shown at the step it came
    assert (reply.text, reply.finish_reason, reply.interrupted) == ("Hello there", "stop", False)
    assert session.conversation.turns == [{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "Hello there"}]


def test_interrupted_reply_is_aborted_and_kept():
    session, engine = _session(["a", "b", "c", "d"])
    reply = session.send("hi", lambda _: None, lambda: engine.steps >= 2)
    assert reply.interrupted and reply.text == "ab"
    assert engine.aborted == ["r0"]
    session.send("next", lambda _: None, lambda: False)  # the session goes on, with the history
    assert engine.tokenizer.seen[-1] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ab"},
                                         {"role": "user", "content": "next"}]


def test_interrupted_before_any_text_drops_the_turn():
    session, engine = _session(["a", "b"])
    reply = session.send("hi", lambda _: None, lambda: True)
    assert reply.interrupted and reply.text == ""
    assert engine.aborted == ["r0"] and session.conversation.turns == []


def test_length_cut_says_which_limit():
    session, engine = _session(["a", "b"], finish_reason="length", params=SamplingParams(max_tokens=2))
    assert session.send("hi", lambda _: None, lambda: False).cut_by == "max_tokens"
    assert engine.requests["r0"][1].max_tokens == 2
    session, engine = _session(["a", "b"], finish_reason="length")
    assert session.send("hi", lambda _: None, lambda: False).cut_by == "context"
    assert engine.requests["r0"][1].max_tokens == 100 - 2  # all the room the prompt leaves


def test_system_prompt_comes_first_and_survives_reset():
    session, engine = _session(["ok"], system="be brief")
    session.send("hi", lambda _: None, lambda: False)
    session.conversation.reset()
    session.send("again", lambda _: None, lambda: False)
    assert engine.tokenizer.seen[-1] == [{"role": "system", "content": "be brief"},
                                         {"role": "user", "content": "again"}]


def test_oldest_turns_are_dropped_to_fit_the_context():
    session, engine = _session(["w " * 10], max_model_len=80)  # a quarter, 20 tokens, is kept for a reply
    for i in range(4):
        reply = session.send(f"message {i} " + "x " * 10, lambda _: None, lambda: False)
    assert reply.dropped_turns == 2
    assert session.conversation.turns[0]["content"].startswith("message 2")
    prompt_ids, _ = engine.requests["r3"]
    assert len(prompt_ids) + 20 <= 80


def test_a_message_too_long_for_the_context_leaves_the_conversation_as_it_was():
    session, engine = _session(["ok"], max_model_len=20)
    session.send("hi", lambda _: None, lambda: False)
    before = list(session.conversation.turns)
    with pytest.raises(ValueError, match="the context holds 20"):
        session.send("word " * 30, lambda _: None, lambda: False)
    assert session.conversation.turns == before and len(engine.requests) == 1


def test_tiny_model_streams_the_same_text_it_returns(tiny_llm):
    engine = tiny_llm.llm_engine
    try:
        session = ChatSession(engine, SamplingParams(max_tokens=6, ignore_eos=True, temperature=0))
        pieces: list[str] = []
        reply = session.send("Hello", pieces.append, lambda: False)
    finally:
        engine.stream_outputs = False  # the shared LLM's setting
    assert reply.finish_reason == "length" and reply.cut_by == "max_tokens" and reply.num_tokens == 6
    assert "".join(pieces) == reply.text
    assert not engine.has_unfinished_requests()


# -- the REPL's lines, with input() scripted ---------------------------------------------------------
def _repl(monkeypatch, lines: list, pieces=("ok",)) -> tuple[int, str, ChatSession]:
    session, _ = _session(list(pieces))
    script = iter(lines)

    def fake_input(prompt=""):
        item = next(script)
        if isinstance(item, type) and issubclass(item, BaseException):
            raise item
        return item

    monkeypatch.setattr(builtins, "input", fake_input)
    out = io.StringIO()
    status = ChatRepl(session, out, interactive=False).run()
    return status, out.getvalue(), session


def test_ctrl_c_twice_at_the_prompt_leaves(monkeypatch):
    status, out, _ = _repl(monkeypatch, ["hi", KeyboardInterrupt, KeyboardInterrupt, "never read"])
    assert status == 0 and out.count("assistant> ok") == 1
    assert out.count("(Ctrl-C again, Ctrl-D or /exit to quit)") == 1


def test_a_line_between_two_ctrl_c_keeps_the_session(monkeypatch):
    status, out, _ = _repl(monkeypatch, [KeyboardInterrupt, "hi", KeyboardInterrupt, "again", EOFError])
    assert status == 0 and out.count("assistant> ok") == 2


def test_commands(monkeypatch):
    lines = ["", "hi", "/help", "/system be brief", "/bogus", "hello", "/reset", "/system", "/exit", "never"]
    status, out, session = _repl(monkeypatch, lines)
    assert status == 0
    assert "/reset " in out and "unknown command /bogus" in out
    assert "[system prompt set; conversation cleared]" in out
    assert "[conversation cleared]" in out and "[system prompt removed; conversation cleared]" in out
    assert session.conversation.system is None and session.conversation.turns == []


def test_length_marker(monkeypatch):
    session, _ = _session(["a", "b"], finish_reason="length", params=SamplingParams(max_tokens=2))
    lines = iter(["hi", "/quit"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    out = io.StringIO()
    ChatRepl(session, out, interactive=False).run()
    assert "assistant> ab\n[reply cut at 2 tokens: raise --max-tokens]\n" in out.getvalue()
