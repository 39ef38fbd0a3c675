"""Reading server-sent events (server/sse.py writes ours): lines split as the SSE spec splits them,
at CRLF, LF or CR, and nowhere else.

httpx's `aiter_lines` splits the way `str.splitlines` does, also at U+0085, U+2028, U+2029 and the
\\x0b-\\x1e separators. JSON escapes the control characters among them but not those three, and a
model can generate them (byte-level BPE decodes C2 85 to U+0085): a `data:` line carrying one was cut
in two, the benchmark client failed the request on half a JSON object, and the fleet router passed
the two halves on as two lines (a broken event for the client behind it). Our server now escapes the
three; readers do not rely on it (the benchmark client measures other servers too, such as vLLM's, and
a fleet replica may run an older tokenmill).
"""
from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Protocol

_EOL = re.compile(r"\r\n|\r|\n")


class _TextStream(Protocol):
    def aiter_text(self) -> AsyncIterator[str]: ...


class LineSplitter:
    """Incremental: feed text as it arrives, get the lines it completed (without their ends)."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, text: str) -> list[str]:
        text = self._pending + text
        # a CR at the very end may be the first half of a CRLF: keep it until the next piece
        cut = len(text) - 1 if text.endswith("\r") else len(text)
        parts = _EOL.split(text[:cut])
        self._pending = parts.pop() + text[cut:]
        return parts

    def flush(self) -> list[str]:
        """The last line, if the stream ended without a line end (a lone CR still ends one)."""
        text, self._pending = self._pending, ""
        if text.endswith("\r"):
            return [text[:-1]]
        return [text] if text else []


async def sse_lines(response: _TextStream) -> AsyncIterator[str]:
    """The lines of a streamed response (an httpx.Response opened with stream=True)."""
    splitter = LineSplitter()
    async for text in response.aiter_text():
        for line in splitter.feed(text):
            yield line
    for line in splitter.flush():
        yield line
