"""`tokenmill chat`: an interactive chat in the terminal, as `ollama run`.

Replies stream as they are generated. Ctrl-C during a reply stops it (the text so far stays in the
conversation, see tokenmill.chat_session); at the prompt it drops the line, and a second Ctrl-C in
a row, Ctrl-D or /exit leaves with status 0. On a terminal, lines are edited with readline and
kept in ~/.cache/tokenmill/chat_history ($TOKENMILL_CACHE/chat_history). Piped stdin works too:
one message per line until end of input.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO

from tokenmill.cli_sampling import CHAT_DEFAULTS, add_sampling_args, check_sampling_args, describe, resolve_sampling
from tokenmill.engine.arg_utils import add_engine_args, add_model_args, engine_config, engine_kwargs

if TYPE_CHECKING:
    from tokenmill.chat_session import ChatSession, Reply

PROMPT = "you> "
REPLY_PREFIX = "assistant> "
HISTORY_FILE = "chat_history"
HISTORY_LENGTH = 1000
HELP = """commands:
  /reset         forget the conversation (the system prompt stays)
  /system TEXT   set the system prompt and start over (/system alone removes it)
  /exit, /quit   leave (so do Ctrl-D, and Ctrl-C twice at the prompt)
  /help          this text
Ctrl-C during a reply stops it; what was written so far stays in the conversation."""


def add_chat_parser(sub) -> None:
    chat = sub.add_parser(
        "chat", help="interactive chat with the model's chat template (streams; Ctrl-C stops a reply)",
        description="Interactive chat, as `ollama run`: replies stream, Ctrl-C stops a reply, /help lists "
                    "the commands. Sampling defaults come from the model folder's generation_config.json "
                    "when it has one (as vLLM), else temperature 0.7, top_p 0.9, repetition_penalty 1.1; "
                    "replies may use all the room left in the context unless --max-tokens is given.")
    add_model_args(chat)
    chat.add_argument("--system", default=None, help="system prompt")
    chat.add_argument("--chat-template", default=None,
                      help="Jinja chat template, or a file holding one, for models whose tokenizer has none")
    add_engine_args(chat)
    add_sampling_args(chat, CHAT_DEFAULTS, multi_output=False)
    chat.set_defaults(func=cmd_chat)


def cmd_chat(args: argparse.Namespace) -> int:
    from tokenmill.server.cli_args import load_chat_template

    config = engine_config(args)  # every flag is checked before the model loads
    check_sampling_args(args, CHAT_DEFAULTS)
    chat_template = load_chat_template(args.chat_template)
    from tokenmill import LLM
    from tokenmill.chat_session import ChatSession
    llm = LLM(config.model, **engine_kwargs(args))
    engine = llm.llm_engine
    if chat_template is None and not getattr(engine.tokenizer, "chat_template", None):
        raise ValueError("the model's tokenizer has no chat template; give one with --chat-template")
    params, source = resolve_sampling(args, CHAT_DEFAULTS, engine.config.model.path)
    session = ChatSession(engine, params, args.system, chat_template, _step_delay_s())
    print(f"tokenmill chat: {engine.model_name}, {session.context_tokens}-token context, {describe(params)} "
          f"(defaults: {source}). /help for commands, Ctrl-D to quit.", file=sys.stderr)
    return ChatRepl(session, sys.stdout, interactive=sys.stdin.isatty()).run()


def _step_delay_s() -> float:
    from tokenmill.engine.async_engine import STEP_DELAY_ENV
    return float(os.environ.get(STEP_DELAY_ENV) or 0.0)


class SigintFlag:
    """While active, Ctrl-C sets a flag instead of raising KeyboardInterrupt: a reply is stopped
    between engine steps, never inside one (that would leave the engine's state half-updated)."""

    def __init__(self) -> None:
        self.raised = False
        self._previous = None

    def __enter__(self) -> SigintFlag:
        self.raised = False
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum, frame) -> None:
        self.raised = True

    def __call__(self) -> bool:
        return self.raised


def enable_line_editing(history: Path) -> Callable[[], None]:
    """Line editing and history for input(); returns the function that saves the history."""
    import readline

    readline.set_history_length(HISTORY_LENGTH)
    try:
        readline.read_history_file(history)
    except OSError:
        pass  # first run, or unreadable: start empty

    def save() -> None:
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)
        except OSError:
            pass  # a read-only home must not break the chat

    return save


def history_path() -> Path:
    from tokenmill.models.gguf_convert import default_cache_dir
    return default_cache_dir() / HISTORY_FILE


class ChatRepl:
    def __init__(self, session: ChatSession, out: TextIO, interactive: bool) -> None:
        self.session = session
        self.out = out
        self.interactive = interactive
        self._last_was_ctrl_c = False

    def run(self) -> int:
        if self.interactive:
            # a terminal session answers Ctrl-C even when started from a shell that ignores SIGINT
            # (a background job inherits SIG_IGN, and Python then keeps it)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        save_history = enable_line_editing(history_path()) if self.interactive else lambda: None
        try:
            while (line := self._read_line()) is not None:
                if not self._handle(line.strip()):
                    break
        finally:
            save_history()
        return 0

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _read_line(self) -> str | None:
        """The next line; None to leave (end of input, or Ctrl-C twice in a row)."""
        while True:
            try:
                line = input(PROMPT if self.interactive else "")  # piped: no prompt to show
            except EOFError:
                self._write("\n")
                return None
            except KeyboardInterrupt:
                self._write("\n")
                if self._last_was_ctrl_c:
                    return None
                self._last_was_ctrl_c = True
                self._write("(Ctrl-C again, Ctrl-D or /exit to quit)\n")
                continue
            self._last_was_ctrl_c = False
            return line

    def _handle(self, line: str) -> bool:
        """Act on one line; False to leave."""
        if not line:
            return True
        if line.startswith("/"):
            return self._command(line)
        self._reply(line)
        return True

    def _command(self, line: str) -> bool:
        name, _, rest = line[1:].partition(" ")
        conversation = self.session.conversation
        if name in ("exit", "quit", "bye"):
            return False
        if name in ("help", "?"):
            self._write(HELP + "\n")
        elif name == "reset":
            conversation.reset()
            self._write("[conversation cleared]\n")
        elif name == "system":
            conversation.system = rest.strip() or None
            conversation.reset()
            self._write(f"[system prompt {'set' if conversation.system else 'removed'}; conversation cleared]\n")
        else:
            self._write(f"unknown command /{name}; /help lists the commands\n")
        return True

    def _reply(self, line: str) -> None:
        self._write(REPLY_PREFIX)
        try:
            with SigintFlag() as stop:
                reply = self.session.send(line, self._write, stop)
        except ValueError as e:  # the message does not fit: the session goes on without it
            self._write(f"\n[error: {e}]\n")
            return
        self._write("\n" + _end_marker(reply, self.session))


def _end_marker(reply: Reply, session: ChatSession) -> str:
    """What to show after a reply that did not end by itself (empty when it did)."""
    lines = []
    if reply.interrupted:
        lines.append("[interrupted]")
    elif reply.cut_by == "max_tokens":
        lines.append(f"[reply cut at {reply.num_tokens} tokens: raise --max-tokens]")
    elif reply.cut_by == "context":
        lines.append(f"[reply cut: the {session.context_tokens}-token context is full; /reset to start over]")
    if reply.dropped_turns:
        lines.append(f"[the {reply.dropped_turns} oldest turns were dropped to fit the context]")
    return "".join(line + "\n" for line in lines)
