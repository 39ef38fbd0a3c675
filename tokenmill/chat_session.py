"""A chat conversation on an LLMEngine: each reply streams out step by step and can be stopped.

Used by `tokenmill chat`; it drives the engine directly (add_request, step, abort_request) so text
is shown as it is generated. An interrupted reply keeps what was generated so far as the
assistant turn (as ollama and vLLM's chat do), so the next turn sees it; when nothing was generated
yet, the user turn is dropped too, as if it had not been sent.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

from tokenmill.engine.chat_template import apply_chat_template
from tokenmill.sampling_params import SamplingParams

# Room kept for a reply when old turns must be dropped to fit the context (capped at a quarter of it).
MIN_REPLY_ROOM = 256


@dataclass
class Reply:
    text: str
    finish_reason: str  # "stop", "length", or "abort" (interrupted)
    num_tokens: int
    cut_by: str | None = None  # for "length": "max_tokens" or "context"
    dropped_turns: int = 0  # oldest turns dropped so the conversation fits the context

    @property
    def interrupted(self) -> bool:
        return self.finish_reason == "abort"


@dataclass
class Conversation:
    system: str | None = None
    turns: list[dict[str, str]] = field(default_factory=list)

    def head(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}] if self.system else []

    def messages(self) -> list[dict[str, str]]:
        return self.head() + self.turns

    def reset(self) -> None:
        self.turns.clear()


class ChatSession:
    def __init__(self, engine, params: SamplingParams, system: str | None = None,
                 chat_template: str | None = None, step_delay_s: float = 0.0) -> None:
        self.engine = engine
        engine.stream_outputs = True  # LLM turns it off; a chat shows every step's text
        self.params = params
        self.conversation = Conversation(system)
        self.chat_template = chat_template
        self.step_delay_s = step_delay_s  # test hook (see tokenmill.engine.async_engine.STEP_DELAY_ENV)

    @property
    def context_tokens(self) -> int:
        return min(self.engine.max_model_len, self.engine.kv_capacity_tokens)

    def send(self, user_text: str, write: Callable[[str], None], interrupted: Callable[[], bool]) -> Reply:
        """Add the user turn, stream the reply through `write`, record it. `interrupted` is polled
        between engine steps; when it turns True the reply stops. Raises ValueError (conversation
        unchanged) when the message alone does not fit the context."""
        turns = self.conversation.turns
        turns.append({"role": "user", "content": user_text})
        try:
            ids, dropped = self._fitting_prompt()
            reply = self._stream(ids, write, interrupted)
        except BaseException:
            turns.pop()
            raise
        reply.dropped_turns = dropped
        if reply.interrupted and not reply.text:
            turns.pop()
        else:
            turns.append({"role": "assistant", "content": reply.text})
        return reply

    def _prompt_ids(self, turns: list[dict[str, str]]) -> list[int]:
        messages = self.conversation.head() + turns
        return apply_chat_template(self.engine.tokenizer, messages, self.chat_template, True, {})

    def _fitting_prompt(self) -> tuple[list[int], int]:
        """The prompt's token ids, dropping the oldest (user, assistant) pairs while the prompt leaves
        too little room for a reply; returns them and how many turns were dropped."""
        limit = self.context_tokens
        room = min(self.params.max_tokens or MIN_REPLY_ROOM, MIN_REPLY_ROOM, max(1, limit // 4))
        turns = self.conversation.turns
        start = 0
        ids = self._prompt_ids(turns)
        while len(ids) + room > limit and len(turns) - start >= 3:
            start += 2
            ids = self._prompt_ids(turns[start:])
        if len(ids) >= limit:
            raise ValueError(f"the message is {len(ids)} tokens with the chat template and the context holds "
                             f"{limit}; send a shorter one, or raise --max-model-len")
        del turns[:start]
        return ids, start

    def _stream(self, ids: list[int], write: Callable[[str], None], interrupted: Callable[[], bool]) -> Reply:
        engine = self.engine
        room = self.context_tokens - len(ids)
        params = self.params
        capped = params.max_tokens is None or params.max_tokens > room
        if capped:
            params = dataclasses.replace(params, max_tokens=room)
        rid = engine.next_request_id()
        engine.add_request(rid, {"prompt_token_ids": ids}, params)
        text, tokens, finish = "", 0, None
        try:
            while finish is None:
                if interrupted():
                    engine.abort_request(rid)
                    finish = "abort"
                    break
                for out in engine.step():
                    if out.request_id != rid:
                        continue
                    done = out.outputs[0]
                    write(done.text[len(text):])  # the detokenizer only ever appends
                    text, tokens = done.text, len(done.token_ids)
                    finish = done.finish_reason
                if finish is None and not engine.has_unfinished_requests():
                    finish = "abort"  # ended without an output: never wait forever
                if self.step_delay_s and finish is None:
                    time.sleep(self.step_delay_s)
        except BaseException:
            engine.abort_request(rid)
            raise
        cut_by = ("context" if capped else "max_tokens") if finish == "length" else None
        return Reply(text, finish, tokens, cut_by)

