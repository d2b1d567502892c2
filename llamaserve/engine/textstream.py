"""Incremental detokenization and stop-string matching for one generation.

Tokens arrive one at a time as raw bytes; a multi-byte character can span
tokens, and a stop string can span tokens. This class emits only text that is
complete UTF-8 and that can no longer turn out to be the start of a stop
string, so a streaming client never sees bytes it would later have to unsee.
"""

from __future__ import annotations

import re


def _utf8_complete_prefix(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end mid-character."""
    n = len(data)
    # A UTF-8 sequence is at most 4 bytes: look back at most 3 for a lead byte.
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0b1100_0000 == 0b1000_0000:
            continue  # continuation byte: keep looking for the lead
        if byte < 0x80:
            return n
        need = 2 if byte >= 0xC0 and byte < 0xE0 else 3 if byte < 0xF0 else 4
        return n if back >= need else n - back
    return n  # only continuation bytes: invalid, let the decoder replace them


class TextStream:
    """Feeds token bytes in, gets safe text out, and reports a hit stop string."""

    def __init__(self, stop: tuple[str, ...] = (), min_indent: int = 0) -> None:
        self.stop = tuple(s for s in stop if s)
        # n_indent: the text ends before the first line, after a newline, that starts with
        # fewer spaces or tabs than this (its indentation stays, as llama-server leaves it).
        self.min_indent = min_indent
        self._indent: int | None = None  # the current line's indentation while it is still unchecked
        self.indent_stopped = False
        # Where a stop string could begin: one regex search per token instead of a loop.
        starts = "".join(sorted({re.escape(s[0]) for s in self.stop}))
        self._stop_start = re.compile(f"[{starts}]") if starts else None
        self._pending_bytes = b""
        self._held = ""  # decoded text not yet emitted (could begin a stop string)
        # Everything emitted so far, in pieces: joined only when asked for, since appending to
        # one string per token copies the whole answer each time.
        self._emitted: list[str] = []
        self.saw_newline = False  # some emitted text held a newline (t_max_predict_ms starts then)
        self.stopping_word = ""

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._emitted)

    def _emit(self, out: str) -> str:
        if out and self.min_indent:
            out = self._cut_at_shallow_line(out)
        if out:
            self._emitted.append(out)
            if not self.saw_newline and "\n" in out:
                self.saw_newline = True
        return out

    def _cut_at_shallow_line(self, out: str) -> str:
        """``out`` up to the first line, after the first newline, indented less than ``min_indent``:
        cut after that line's spaces and tabs, at its first other character or its newline."""
        for i, ch in enumerate(out):
            if ch == "\n":
                if self._indent is not None and self._indent < self.min_indent:
                    self.indent_stopped = True  # a blank line ends it too, as in llama-server
                    return out[:i]
                self._indent = 0
            elif self._indent is None:
                continue  # before the first newline, or a line already found deep enough
            elif ch in " \t":
                self._indent += 1
            elif self._indent < self.min_indent:
                self.indent_stopped = True
                return out[:i]
            else:
                self._indent = None
        return out

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return text now safe to emit (may be '')."""
        data = self._pending_bytes + piece if self._pending_bytes else piece
        # Most pieces end in ASCII, which always completes a character.
        cut = len(data) if data and data[-1] < 0x80 else _utf8_complete_prefix(data)
        if cut == 0:
            self._pending_bytes = data
            return ""
        self._pending_bytes = data[cut:]
        self._held += (data if cut == len(data) else data[:cut]).decode("utf-8", errors="replace")
        return self._release()

    def _release(self) -> str:
        if not self.stop:
            out, self._held = self._held, ""
            return self._emit(out)
        held = self._held
        if self._stop_start is None or not self._stop_start.search(held):
            # No stop string can begin anywhere in the held text: all of it is safe.
            self._held = ""
            return self._emit(held)
        # A full stop string ends generation; text before it is emitted.
        best = -1
        for s in self.stop:
            i = self._held.find(s)
            if i != -1 and (best == -1 or i < best):
                best, self.stopping_word = i, s
        if best != -1:
            out = self._held[:best]
            self._held = ""
            return self._emit(out)
        keep = self._stop_prefix_tail()
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        return self._emit(out)

    def _stop_prefix_tail(self) -> int:
        """Length of the longest tail of the held text that is a prefix of some stop string.

        A tail can only begin where a stop string's first character occurs, so str.find jumps
        to those places instead of trying every length (this runs once per generated token).
        """
        held = self._held
        keep = 0
        for s in self.stop:
            i = held.find(s[0], max(0, len(held) - len(s) + 1))
            while i != -1 and len(held) - i > keep:
                if s.startswith(held[i:]):
                    keep = len(held) - i
                    break
                i = held.find(s[0], i + 1)
        return keep

    def flush(self) -> str:
        """Generation ended without a stop string: emit what was held back."""
        # An incomplete trailing character (cut off by a token limit) is
        # dropped rather than emitted as a replacement character.
        rest = "" if self.indent_stopped else self._held
        self._held, self._pending_bytes = "", b""
        return self._emit(rest)

    @property
    def stopped(self) -> bool:
        return bool(self.stopping_word)
