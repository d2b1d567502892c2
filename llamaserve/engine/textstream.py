"""Incremental detokenization and stop-string matching for one generation.

Tokens arrive one at a time as raw bytes; a multi-byte character can span
tokens, and a stop string can span tokens. This class emits only text that is
complete UTF-8 and that can no longer turn out to be the start of a stop
string, so a streaming client never sees bytes it would later have to unsee.
"""

from __future__ import annotations


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

    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        self.stop = tuple(s for s in stop if s)
        self._max_stop = max((len(s) for s in self.stop), default=0)
        self._pending_bytes = b""
        self._held = ""  # decoded text not yet emitted (could begin a stop string)
        self.text = ""  # everything emitted so far
        self.stopping_word = ""

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; return text now safe to emit (may be '')."""
        data = self._pending_bytes + piece
        cut = _utf8_complete_prefix(data)
        self._pending_bytes = data[cut:]
        if cut == 0:
            return ""
        self._held += data[:cut].decode("utf-8", errors="replace")
        return self._release()

    def _release(self) -> str:
        if not self.stop:
            out, self._held = self._held, ""
            self.text += out
            return out
        # A full stop string ends generation; text before it is emitted.
        best = -1
        for s in self.stop:
            i = self._held.find(s)
            if i != -1 and (best == -1 or i < best):
                best, self.stopping_word = i, s
        if best != -1:
            out = self._held[:best]
            self._held = ""
            self.text += out
            return out
        # Hold back the longest tail that is a prefix of some stop string.
        keep = 0
        tail_max = min(len(self._held), self._max_stop - 1)
        for length in range(tail_max, 0, -1):
            tail = self._held[-length:]
            if any(s.startswith(tail) for s in self.stop):
                keep = length
                break
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep :]
        self.text += out
        return out

    def flush(self) -> str:
        """Generation ended without a stop string: emit what was held back."""
        # An incomplete trailing character (cut off by a token limit) is
        # dropped rather than emitted as a replacement character.
        rest = self._held
        self._held, self._pending_bytes = "", b""
        self.text += rest
        return rest

    @property
    def stopped(self) -> bool:
        return bool(self.stopping_word)
