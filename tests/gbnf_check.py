"""A small, independent GBNF reader and matcher: does a grammar accept a given text?

llama.cpp only ever *samples* with a grammar; it cannot answer "is this string in the language".
This module can, which makes grammars testable without a model: parse the GBNF text (the same
syntax llama.cpp's parser reads), then match whole strings against ``root``. It also reports the
two limits llama.cpp enforces while parsing -- its repetition threshold and the number of rules
its expansion creates -- so tests can check a grammar would load.

The matcher computes, for each (rule, position), the set of positions where the rule can end
(memoised), so ambiguity costs no backtracking blow-up. It is meant for short texts in tests and
debugging, not for production traffic (it also raises the interpreter's recursion limit while
matching, which is process-wide). Left-recursive grammars (which llama.cpp rejects) are reported
as :class:`GrammarError`.

Public API: :func:`parse_gbnf`, :class:`Grammar` (``matches``, ``llama_rule_count``,
``check_llama_limits``), :class:`GrammarError`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final, TypeAlias

__all__ = ["Grammar", "GrammarError", "parse_gbnf"]

# llama.cpp's MAX_REPETITION_THRESHOLD: larger counts are refused (or silently unbounded).
LLAMA_MAX_REPETITION: Final = 2000


class GrammarError(ValueError):
    """The text is not GBNF this reader understands, or the grammar is left-recursive."""


@dataclass(frozen=True)
class Chars:
    """One character from a set of inclusive code-point ranges (``negated`` = outside them)."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def accepts(self, cp: int) -> bool:
        return any(lo <= cp <= hi for lo, hi in self.ranges) != self.negated


@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Repeat:
    item: Node
    lo: int
    hi: int | None


@dataclass(frozen=True)
class Group:
    """Parenthesised alternatives (llama.cpp makes a rule of each)."""

    alts: tuple[tuple[Node, ...], ...]


Node: TypeAlias = Chars | Literal | Ref | Repeat | Group


@dataclass
class Grammar:
    rules: dict[str, tuple[tuple[Node, ...], ...]] = field(default_factory=dict)

    # ---- matching --------------------------------------------------------------------------

    def matches(self, text: str, start: str = "root") -> bool:
        """Whether the whole of ``text`` derives from rule ``start``."""
        if start not in self.rules:
            raise GrammarError(f"no rule {start!r}")
        memo: dict[tuple[str, int], frozenset[int]] = {}
        active: set[tuple[str, int]] = set()
        with _recursion_limit(20000):
            return len(text) in self._rule_ends(start, text, 0, memo, active)

    def _rule_ends(
        self, name: str, text: str, pos: int, memo: dict[tuple[str, int], frozenset[int]], active: set[tuple[str, int]]
    ) -> frozenset[int]:
        key = (name, pos)
        if key in memo:
            return memo[key]
        if key in active:
            raise GrammarError(f"left recursion through rule {name!r}")
        active.add(key)
        try:
            ends = self._alts_ends(self.rules[name], text, pos, memo, active)
        finally:
            active.discard(key)
        memo[key] = ends
        return ends

    def _alts_ends(
        self,
        alts: tuple[tuple[Node, ...], ...],
        text: str,
        pos: int,
        memo: dict[tuple[str, int], frozenset[int]],
        active: set[tuple[str, int]],
    ) -> frozenset[int]:
        out: set[int] = set()
        for seq in alts:
            current = {pos}
            for node in seq:
                nxt: set[int] = set()
                for p in current:
                    nxt |= self._node_ends(node, text, p, memo, active)
                current = nxt
                if not current:
                    break
            out |= current
        return frozenset(out)

    def _node_ends(
        self, node: Node, text: str, pos: int, memo: dict[tuple[str, int], frozenset[int]], active: set[tuple[str, int]]
    ) -> frozenset[int]:
        if isinstance(node, Chars):
            ok = pos < len(text) and node.accepts(ord(text[pos]))
            return frozenset({pos + 1}) if ok else frozenset()
        if isinstance(node, Literal):
            ok = text.startswith(node.text, pos)
            return frozenset({pos + len(node.text)}) if ok else frozenset()
        if isinstance(node, Ref):
            if node.name not in self.rules:
                raise GrammarError(f"undefined rule {node.name!r}")
            return self._rule_ends(node.name, text, pos, memo, active)
        if isinstance(node, Group):
            return self._alts_ends(node.alts, text, pos, memo, active)
        # Repeat: walk counts; past the minimum, stop once no new end position appears.
        result: set[int] = set()
        frontier = {pos}
        seen: set[int] = set()
        count = 0
        while frontier:
            if count >= node.lo:
                result |= frontier
                seen |= frontier
            if node.hi is not None and count == node.hi:
                break
            nxt: set[int] = set()
            for p in frontier:
                nxt |= self._node_ends(node.item, text, p, memo, active)
            count += 1
            frontier = nxt - seen if count > node.lo else nxt
        return frozenset(result)

    # ---- llama.cpp limits ------------------------------------------------------------------

    def llama_rule_count(self) -> int:
        """Rules llama.cpp's parser creates: one per rule, per group, and per repetition step."""
        return sum(1 + sum(_generated(n) for seq in alts for n in seq) for alts in self.rules.values())

    def check_llama_limits(self) -> None:
        """Raise GrammarError where llama.cpp's parser would refuse (or silently alter) a
        repetition: counts above its threshold, or a repeated group whose rules times the count
        reaches it."""
        for name, alts in self.rules.items():
            for seq in alts:
                for node in seq:
                    _check_node(name, node)


def _generated(node: Node) -> int:
    if isinstance(node, Group):
        return 1 + sum(_generated(n) for seq in node.alts for n in seq)
    if isinstance(node, Repeat):
        steps = 1 if node.hi is None else node.hi - node.lo
        return _generated(node.item) + steps
    return 0


def _check_node(rule: str, node: Node) -> None:
    if isinstance(node, Group):
        for seq in node.alts:
            for n in seq:
                _check_node(rule, n)
    elif isinstance(node, Repeat):
        _check_node(rule, node.item)
        if node.lo > LLAMA_MAX_REPETITION or (node.hi is not None and node.hi > LLAMA_MAX_REPETITION):
            raise GrammarError(f"rule {rule!r}: repetition count above {LLAMA_MAX_REPETITION}")
        inner = _generated(node.item) if isinstance(node.item, Group) else 1
        total = node.hi if node.hi else node.lo if node.lo else 1
        if max(inner, 1) * total >= LLAMA_MAX_REPETITION:
            raise GrammarError(f"rule {rule!r}: repeated group too large for llama.cpp")


@contextmanager
def _recursion_limit(limit: int) -> Iterator[None]:
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


# --------------------------------------------------------------------------------------------
# Parsing.

_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


class _Parser:
    def __init__(self, src: str) -> None:
        self.src = src
        self.pos = 0

    def fail(self, message: str) -> GrammarError:
        line = self.src.count("\n", 0, self.pos) + 1
        return GrammarError(f"line {line}: {message} at {self.src[self.pos : self.pos + 20]!r}")

    def peek(self) -> str:
        return self.src[self.pos] if self.pos < len(self.src) else ""

    def space(self, newlines: bool) -> None:
        while self.pos < len(self.src):
            c = self.src[self.pos]
            if c == "#":
                while self.pos < len(self.src) and self.src[self.pos] not in "\r\n":
                    self.pos += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.pos += 1
            else:
                break

    def name(self) -> str:
        start = self.pos
        while self.peek() and self.peek() in _NAME_CHARS:
            self.pos += 1
        if self.pos == start:
            raise self.fail("expected a rule name")
        return self.src[start : self.pos]

    def grammar(self) -> Grammar:
        g = Grammar()
        self.space(True)
        while self.pos < len(self.src):
            name = self.name()
            self.space(False)
            if not self.src.startswith("::=", self.pos):
                raise self.fail("expected '::='")
            self.pos += 3
            self.space(True)
            g.rules[name] = self.alternates(nested=False)
            if self.peek() not in ("", "\n", "\r"):
                raise self.fail("expected end of line")
            self.space(True)
        for alts in g.rules.values():
            for seq in alts:
                for node in seq:
                    _check_refs(g, node)
        return g

    def alternates(self, nested: bool) -> tuple[tuple[Node, ...], ...]:
        alts = [self.sequence(nested)]
        while self.peek() == "|":
            self.pos += 1
            self.space(True)
            alts.append(self.sequence(nested))
        return tuple(alts)

    def sequence(self, nested: bool) -> tuple[Node, ...]:
        items: list[Node] = []
        while True:
            c = self.peek()
            if c == '"':
                self.pos += 1
                text = []
                while self.peek() != '"':
                    if not self.peek():
                        raise self.fail("unterminated literal")
                    text.append(self.char())
                self.pos += 1
                items.append(Literal("".join(chr(x) for x in text)))
            elif c == "[":
                items.append(self.char_class())
            elif c == ".":
                self.pos += 1
                items.append(Chars((), negated=True))
            elif c and c in _NAME_CHARS:
                items.append(Ref(self.name()))
            elif c == "(":
                self.pos += 1
                self.space(True)
                alts = self.alternates(nested=True)
                if self.peek() != ")":
                    raise self.fail("expected ')'")
                self.pos += 1
                items.append(Group(alts))
            elif c in ("*", "+", "?", "{"):
                if not items:
                    raise self.fail("repetition without a preceding item")
                items[-1] = self.repetition(items[-1])
            else:
                break
            self.space(nested)
        return tuple(items)

    def repetition(self, item: Node) -> Node:
        c = self.peek()
        self.pos += 1
        if c == "*":
            return Repeat(item, 0, None)
        if c == "+":
            return Repeat(item, 1, None)
        if c == "?":
            return Repeat(item, 0, 1)
        self.space(True)
        lo = self.integer()
        self.space(True)
        hi: int | None = lo
        if self.peek() == ",":
            self.pos += 1
            self.space(True)
            hi = self.integer() if self.peek().isdigit() else None
            self.space(True)
        if self.peek() != "}":
            raise self.fail("expected '}'")
        self.pos += 1
        return Repeat(item, lo, hi)

    def integer(self) -> int:
        start = self.pos
        while self.peek().isdigit():
            self.pos += 1
        if start == self.pos:
            raise self.fail("expected an integer")
        return int(self.src[start : self.pos])

    def char(self) -> int:
        c = self.peek()
        if c != "\\":
            self.pos += 1
            return ord(c)
        esc = self.src[self.pos + 1 : self.pos + 2]
        widths = {"x": 2, "u": 4, "U": 8}
        if esc in widths:
            digits = self.src[self.pos + 2 : self.pos + 2 + widths[esc]]
            try:
                value = int(digits, 16)
            except ValueError:
                raise self.fail("bad hex escape") from None
            if len(digits) != widths[esc]:
                raise self.fail("bad hex escape")
            self.pos += 2 + widths[esc]
            return value
        simple = {"t": 9, "r": 13, "n": 10, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45}
        if esc not in simple:
            raise self.fail("unknown escape")
        self.pos += 2
        return simple[esc]

    def char_class(self) -> Chars:
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            if not self.peek():
                raise self.fail("unterminated character class")
            lo = self.char()
            hi = lo
            if self.peek() == "-" and self.src[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                hi = self.char()
            ranges.append((lo, hi))
        self.pos += 1
        return Chars(tuple(ranges), negated)


def _check_refs(g: Grammar, node: Node) -> None:
    if isinstance(node, Ref) and node.name not in g.rules:
        raise GrammarError(f"undefined rule {node.name!r}")
    if isinstance(node, Group):
        for seq in node.alts:
            for n in seq:
                _check_refs(g, n)
    if isinstance(node, Repeat):
        _check_refs(g, node.item)


def parse_gbnf(text: str) -> Grammar:
    """Parse GBNF text (llama.cpp syntax: rules, literals, classes, groups, ``? * + {m,n}``)."""
    return _Parser(text).grammar()
