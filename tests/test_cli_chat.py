"""`tokenmill chat` in a pseudo-terminal (pexpect) and with piped stdin, on the tiny model.

Nothing here depends on the machine's speed: a reply that must still be running when the test
acts is slowed by the engine's test hook (a sleep after every step, hundreds of steps), and the
timeouts are only safety nets."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pexpect

from tokenmill.engine.async_engine import STEP_DELAY_ENV

REPO = Path(__file__).resolve().parents[1]
TINY_ARGS = ["--kv-cache-memory-gb", "0.01", "--dtype", "float32", "--num-threads", "1"]
PROMPT = "you> "
TINY_CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
                      "{% if add_generation_prompt %}<s>assistant:{% endif %}")


def _env(cache: Path, **extra: str) -> dict[str, str]:
    """This tree's tokenmill, a real terminal type, and the history file under `cache`."""
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), TERM="xterm",
                TOKENMILL_CACHE=str(cache), **extra)


def _spawn(model: Path, cache: Path, *args: str, **env: str) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "tokenmill", "chat", str(model), *TINY_ARGS, *args],
                          cwd=str(REPO), env=_env(cache, **env), encoding="utf-8", timeout=180,
                          dimensions=(24, 200))
    child.logfile_read = io.StringIO()
    child.expect_exact(PROMPT)
    return child


def _finish(child: pexpect.spawn) -> str:
    """Wait for the exit; it must be status 0. Returns the transcript."""
    child.expect(pexpect.EOF)
    child.close()
    transcript = child.logfile_read.getvalue()
    assert child.exitstatus == 0, transcript
    assert "Traceback" not in transcript
    return transcript


def _interrupt_at_prompt(child: pexpect.spawn) -> None:
    """Ctrl-C while input() waits. CPython's readline loop only notices a SIGINT that arrives while
    it blocks in select(): one delivered just after the prompt is drawn but before the loop blocks
    waits for the next keystroke. Typing a character and waiting for its echo puts the loop in
    select() for sure, so the test does not depend on how fast the prompt is reached."""
    child.send("x")
    child.expect_exact("x")
    child.sendintr()


def test_reply_streams_and_ctrl_c_stops_it_not_the_session(tiny_llama, tmp_path):
    # with the step delay a full reply (~500 tokens, EOS ignored) lasts ~25 s: it is still running
    # when the test sends Ctrl-C, so "[interrupted]" proves its first text was shown before its end
    child = _spawn(tiny_llama, tmp_path, "--ignore-eos", **{STEP_DELAY_ENV: "0.05"})
    for message in ("hello", "and again"):
        child.send(message + "\r")
        child.expect_exact("assistant> ")
        child.expect(r"\S")  # streamed text
        child.sendintr()
        child.expect_exact("[interrupted]")
        child.expect_exact(PROMPT)  # the session goes on
    _interrupt_at_prompt(child)  # drops the line and says how to leave
    child.expect_exact("(Ctrl-C again, Ctrl-D or /exit to quit)")
    child.expect_exact(PROMPT)
    _interrupt_at_prompt(child)
    transcript = _finish(child)
    assert "[reply cut" not in transcript


def test_commands_length_marker_and_line_editing(tiny_llama, tmp_path):
    child = _spawn(tiny_llama, tmp_path, "--max-tokens", "3", "--ignore-eos", "--chat-template", TINY_CHAT_TEMPLATE)
    child.send("hi\r")
    child.expect_exact("[reply cut at 3 tokens: raise --max-tokens]")
    child.expect_exact(PROMPT)
    child.send("/help\r")
    child.expect_exact("/system TEXT")
    child.expect_exact(PROMPT)
    child.send("\x1b[A\r")  # up arrow: the last line again
    child.expect_exact("/system TEXT")
    child.expect_exact(PROMPT)
    child.send("/system be brief\r")
    child.expect_exact("[system prompt set; conversation cleared]")
    child.expect_exact(PROMPT)
    child.send("/reset\r")
    child.expect_exact("[conversation cleared]")
    child.expect_exact(PROMPT)
    child.send("/ext\x1b[Di\r")  # left arrow, then insert: "/exit"
    transcript = _finish(child)
    assert "^[[" not in transcript and "unknown command" not in transcript
    history = (tmp_path / "chat_history").read_text().splitlines()
    assert history[0] == "hi" and history[-1] == "/exit"

    child = _spawn(tiny_llama, tmp_path)  # a new session recalls the saved history
    child.send("\x1b[A\r")
    _finish(child)


def test_ctrl_d_leaves(tiny_llama, tmp_path):
    child = _spawn(tiny_llama, tmp_path)
    child.sendeof()
    _finish(child)


def test_piped_stdin_reads_turns_until_end_of_input(tiny_llama, tmp_path):
    out = subprocess.run([sys.executable, "-m", "tokenmill", "chat", "--model", str(tiny_llama), "--max-tokens", "3",
                          *TINY_ARGS], input="hi there\n\nand again\n", capture_output=True, text=True, timeout=300,
                         cwd=REPO, env=_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("assistant> ") == 2  # the empty line is skipped, end of input leaves
    assert PROMPT not in out.stdout
    assert not (tmp_path / "chat_history").exists()  # no terminal: no line editing, no history
