"""Incremental detokenisation, correct for multi-byte UTF-8 split over tokens and for BPE merges.

Text is produced by decoding a short window of tokens and emitting only what changed; a window that
ends in an incomplete character (U+FFFD) waits for the next token. Stop strings are found in the
text and cut; while running, the last (longest stop - 1) characters are held back so a stop string
never leaks into a stream."""
from __future__ import annotations

from dataclasses import dataclass, field

_CONTEXT = 5  # prompt tokens used as left context so the first word gets its leading space right


@dataclass
class DetokState:
    token_ids: list[int]          # prompt + output
    prefix_offset: int
    read_offset: int
    text: str = ""                # all output text so far (before stop-string truncation)
    stop_hit: str | None = None
    skip_special: bool = True
    stops: list[str] = field(default_factory=list)


class IncrementalDetokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        # the Rust tokenizer's decode skips transformers' per-call Python conversions
        self._fast = getattr(tokenizer, "backend_tokenizer", None)
        self._token_text: dict[int, str] = {}  # one token decoded alone (logprob entries), bounded by the vocab

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self._decode([token_id], False)
        return text

    def start(self, prompt_token_ids: list[int], stops: list[str], skip_special: bool) -> DetokState:
        n = len(prompt_token_ids)
        return DetokState(list(prompt_token_ids[-_CONTEXT:]), prefix_offset=0, read_offset=min(n, _CONTEXT),
                          skip_special=skip_special, stops=stops)

    def _decode(self, ids: list[int], skip_special: bool) -> str:
        if self._fast is not None:
            return self._fast.decode(ids, skip_special_tokens=skip_special)
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special,
                                     clean_up_tokenization_spaces=False)

    def add_token(self, st: DetokState, token_id: int, check_stops: bool = True) -> str:
        """Append one token; returns the newly completed text (may be empty). Stop strings are
        searched only with check_stops (once min_tokens are out, as vLLM), and must end in the new
        text (a stop string may begin in earlier text)."""
        st.token_ids.append(token_id)
        prefix = self._decode(st.token_ids[st.prefix_offset:st.read_offset], st.skip_special)
        full = self._decode(st.token_ids[st.prefix_offset:], st.skip_special)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        delta = full[len(prefix):]
        st.prefix_offset, st.read_offset = st.read_offset, len(st.token_ids)
        # keep the window short: drop tokens before prefix_offset
        if st.prefix_offset > 64:
            st.token_ids = st.token_ids[st.prefix_offset:]
            st.read_offset -= st.prefix_offset
            st.prefix_offset = 0
        old_len = len(st.text)
        st.text += delta
        if not check_stops:
            return delta
        # a stop string must end in the new text (it may begin up to len(stop) - 1 characters before it)
        found = [(i, stop) for stop in st.stops if (i := st.text.find(stop, max(0, old_len - len(stop) + 1))) != -1]
        if found:
            i, st.stop_hit = min(found)
            st.text = st.text[:i]
        return delta

    @staticmethod
    def visible_text(st: DetokState, finished: bool, include_stop: bool) -> str:
        if st.stop_hit is not None:
            return st.text + (st.stop_hit if include_stop else "")
        if finished or not st.stops:
            return st.text
        hold = max(len(s) for s in st.stops) - 1
        return st.text[: len(st.text) - hold] if hold else st.text
