"""Which server has recently seen a prompt's beginning: chained hashes of fixed-size text blocks.

A request's prompt-bearing fields (system text, tools, messages or input, prompt) are
serialised in a fixed order as compact JSON, so a conversation's next turn serialises to a
string that starts with the previous turn's. That string is cut into `BLOCK` characters and
each block's hash chains the one before, so block i's hash stands for the whole text up to
it. A server's index keeps the hashes of the prompts it was sent (most recent last, bounded);
the length of a request's leading run of known hashes is how much of its prompt the server's
prompt cache probably still holds.

Text instead of tokens: asking a server's /tokenize for every request costs a round trip
that the routing does not need (the server's template renders the same messages to the same
tokens); benchmarks/scale_bench.py measures both.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

BLOCK = 256  # characters per block: about 64 tokens of English text
MAX_BLOCKS = 512  # a request's blocks looked at (128 KiB of prompt text)
_FIELDS = ("system", "instructions", "tools", "messages", "input", "prompt", "input_prefix", "input_extra")


def prompt_text(body: Any) -> str:
    """The prompt-bearing fields of a JSON request body, serialised so that a prefix stays a prefix."""
    if not isinstance(body, dict):
        return ""
    parts: list[str] = []
    for name in _FIELDS:
        if name in body:
            value = body[name]
            text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)
            # A list that grows by one message keeps its serialised prefix only without the closing bracket.
            if isinstance(value, list) and text.endswith("]"):
                text = text[:-1]
            parts.append(f"{name}\x00{text}")
    return "\x01".join(parts)


def block_hashes(text: str) -> list[bytes]:
    """One chained hash per whole block of `text` (a partial last block is left out)."""
    out: list[bytes] = []
    previous = b""
    data = text.encode("utf-8", "surrogatepass")
    for start in range(0, min(len(data) // BLOCK, MAX_BLOCKS) * BLOCK, BLOCK):
        previous = hashlib.blake2b(previous + data[start : start + BLOCK], digest_size=8).digest()
        out.append(previous)
    return out


class PrefixIndex:
    """The block hashes of one server's recent prompts, least recently used dropped first."""

    def __init__(self, capacity: int = 50_000) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, hashes: list[bytes]) -> None:
        for h in hashes:
            self._seen[h] = None
            self._seen.move_to_end(h)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)

    def match(self, hashes: list[bytes]) -> int:
        """How many leading blocks of a prompt this server has seen (chained: the longest known one)."""
        # Chained hashes: a known block i means the server was sent the whole text up to it,
        # even when the index has since dropped an earlier block, so the last known one counts.
        for i in range(len(hashes), 0, -1):
            if hashes[i - 1] in self._seen:
                return i
        return 0

    def clear(self) -> None:
        self._seen.clear()
