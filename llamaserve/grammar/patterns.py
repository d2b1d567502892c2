"""Regular expressions of JSON Schema ``pattern`` (the ECMA-262 subset used in practice):
parsed into a small tree, analysed (lengths, anchors) and narrowed to length limits;
the ``format`` grammars are written as such patterns."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final, TypeAlias

from llamaserve.grammar.common import _MAX_DEPTH, SchemaError, _err
from llamaserve.grammar.gbnf import _MAX_CP, Intervals, _iv, _iv_complement, _iv_intersect

# --------------------------------------------------------------------------------------------
# Regular expressions (the ECMA-262 subset JSON Schema patterns use in practice).


@dataclass(frozen=True)
class _RSet:
    chars: Intervals


@dataclass(frozen=True)
class _RSeq:
    items: tuple[_RNode, ...]


@dataclass(frozen=True)
class _RAlt:
    options: tuple[_RNode, ...]


@dataclass(frozen=True)
class _RRep:
    item: _RNode
    lo: int
    hi: int | None


@dataclass(frozen=True)
class _RAnchor:
    start: bool


_RNode: TypeAlias = _RSet | _RSeq | _RAlt | _RRep | _RAnchor

_ANY_CHAR: Final = _RSet(((0, _MAX_CP),))
_DIGIT: Final = _iv([(0x30, 0x39)])
_WORD: Final = _iv([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
# Shorthand classes mean slightly different things to ECMA-262 (what JSON Schema specifies),
# Python's re and Rust's regex (what Python validators actually run): \w and \d are ASCII in
# ECMA but Unicode-aware in the others, and the whitespace sets differ at the edges. So each
# class is narrowed to what *every* engine agrees on: \d \w = the ASCII sets, \D \W = ASCII
# characters outside them, \s = whitespace in all three, \S = whitespace in none.
_ASCII: Final = _iv([(0x00, 0x7F)])
_SPACE: Final = _iv(
    [
        (0x09, 0x0D),
        (0x20, 0x20),
        (0xA0, 0xA0),
        (0x1680, 0x1680),
        (0x2000, 0x200A),
        (0x2028, 0x2029),
        (0x202F, 0x202F),
        (0x205F, 0x205F),
        (0x3000, 0x3000),
    ]
)
_ANY_ENGINE_SPACE: Final = _iv([*_SPACE, (0x1C, 0x1F), (0x85, 0x85), (0xFEFF, 0xFEFF)])
_SHORTHANDS: Final[dict[str, Intervals]] = {
    "d": _DIGIT,
    "D": _iv_intersect(_ASCII, _iv_complement(_DIGIT)),
    "w": _WORD,
    "W": _iv_intersect(_ASCII, _iv_complement(_WORD)),
    "s": _SPACE,
    "S": _iv_complement(_ANY_ENGINE_SPACE),
}
_LINE_TERMINATORS: Final = _iv([(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)])
_QUANT_RE: Final = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")


class _RegexParser:
    """Recursive-descent parser for a pattern into a small AST; rejects what it cannot honour."""

    def __init__(self, pattern: str, path: str) -> None:
        self.src = pattern
        self.pos = 0
        self.path = path
        self.depth = 0

    def fail(self, message: str) -> SchemaError:
        return _err(self.path, f"{message} (at offset {self.pos} of pattern {self.src!r})")

    def parse(self) -> _RNode:
        node = self.alternation()
        if self.pos != len(self.src):
            raise self.fail("unbalanced ')'")
        return node

    def peek(self) -> str:
        return self.src[self.pos] if self.pos < len(self.src) else ""

    def alternation(self) -> _RNode:
        options = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            options.append(self.sequence())
        return options[0] if len(options) == 1 else _RAlt(tuple(options))

    def sequence(self) -> _RNode:
        items: list[_RNode] = []
        while self.peek() not in ("", "|", ")"):
            items.append(self.quantified())
        return items[0] if len(items) == 1 else _RSeq(tuple(items))

    def quantified(self) -> _RNode:
        atom = self.atom()
        c = self.peek()
        lo: int
        hi: int | None
        if c in ("*", "+", "?"):
            self.pos += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{" and (m := _QUANT_RE.match(self.src, self.pos)):
            self.pos = m.end()
            lo = int(m.group(1))
            hi = lo if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
            if hi is not None and hi < lo:
                raise self.fail("numbers out of order in {} quantifier")
        else:
            return atom
        if isinstance(atom, _RAnchor):
            raise self.fail("quantified anchor")
        if self.peek() == "?":  # lazy: matching is the same set of strings
            self.pos += 1
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and _QUANT_RE.match(self.src, self.pos)):
            raise self.fail("nothing to repeat")
        return _RRep(atom, lo, hi)

    def atom(self) -> _RNode:
        c = self.peek()
        if c == "(":
            return self.group()
        if c == "[":
            return _RSet(self.char_class())
        self.pos += 1
        if c == ".":
            return _RSet(_iv_complement(_LINE_TERMINATORS))
        if c == "^":
            return _RAnchor(start=True)
        if c == "$":
            return _RAnchor(start=False)
        if c in ("*", "+", "?"):
            self.pos -= 1
            raise self.fail("nothing to repeat")
        if c == "{" and _QUANT_RE.match(self.src, self.pos - 1):
            self.pos -= 1
            raise self.fail("nothing to repeat")
        if c == "\\":
            return _RSet(self.escape(in_class=False))
        return _RSet(((ord(c), ord(c)),))

    def group(self) -> _RNode:
        self.pos += 1
        if self.src.startswith("?", self.pos):
            if self.src.startswith("?:", self.pos):
                self.pos += 2
            elif self.src.startswith("?<", self.pos) and not self.src.startswith(("?<=", "?<!"), self.pos):
                end = self.src.find(">", self.pos)
                if end < 0:
                    raise self.fail("unterminated group name")
                self.pos = end + 1
            elif self.src.startswith(("?=", "?!", "?<=", "?<!"), self.pos):
                raise self.fail("lookaround assertions are not supported")
            else:
                raise self.fail("unsupported group syntax")
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise self.fail("groups nested too deeply")
        node = self.alternation()
        self.depth -= 1
        if self.peek() != ")":
            raise self.fail("missing ')'")
        self.pos += 1
        return node

    def escape(self, in_class: bool) -> Intervals:
        """Parse after a backslash; returns the set of characters it stands for."""
        c = self.peek()
        if not c:
            raise self.fail("trailing backslash")
        self.pos += 1
        if c in _SHORTHANDS:
            return _SHORTHANDS[c]
        simple = {"n": 0x0A, "r": 0x0D, "t": 0x09, "f": 0x0C, "v": 0x0B}
        if c in simple:
            return ((simple[c], simple[c]),)
        if c == "b" and in_class:
            return ((0x08, 0x08),)
        if c in ("b", "B"):
            raise self.fail("word-boundary assertions are not supported")
        if c == "0" and not self.peek().isdigit():
            return ((0, 0),)
        if c.isdigit():
            raise self.fail("backreferences are not supported")
        if c == "x" or (c == "u" and self.peek() != "{"):
            width = 2 if c == "x" else 4
            digits = self.src[self.pos : self.pos + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"bad \\{c} escape")
            self.pos += width
            cp = int(digits, 16)
            return ((cp, cp),)
        if c in ("u", "p", "P", "k", "c"):
            raise self.fail(f"\\{c} escapes are not supported")
        if c.isalnum():
            raise self.fail(f"unknown escape \\{c}")
        return ((ord(c), ord(c)),)  # escaped punctuation stands for itself

    def char_class(self) -> Intervals:
        self.pos += 1
        negate = self.peek() == "^"
        if negate:
            self.pos += 1
        pairs: list[tuple[int, int]] = []
        while self.peek() != "]":
            if not self.peek():
                raise self.fail("unterminated character class")
            lo_set = self.class_atom()
            if self.peek() == "-" and self.src[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                hi_set = self.class_atom()
                if (
                    len(lo_set) != 1
                    or len(hi_set) != 1
                    or lo_set[0][0] != lo_set[0][1]
                    or (hi_set[0][0] != hi_set[0][1])
                ):
                    raise self.fail("character class escape used as a range bound")
                if hi_set[0][0] < lo_set[0][0]:
                    raise self.fail("range out of order in character class")
                pairs.append((lo_set[0][0], hi_set[0][0]))
            else:
                pairs.extend(lo_set)
        self.pos += 1
        iv = _iv(pairs)
        return _iv_complement(iv) if negate else iv

    def class_atom(self) -> Intervals:
        c = self.peek()
        self.pos += 1
        if c == "\\":
            if self.peek() == "-":
                self.pos += 1
                return ((0x2D, 0x2D),)
            return self.escape(in_class=True)
        return ((ord(c), ord(c)),)


# A lazy grammar's trigger patterns (/completion's grammar_triggers) are compiled by llama.cpp
# with std::regex, and what that throws ends the process. So they are held to what the parser
# above accepts, less what std::regex's ECMAScript may lack (named groups, \0, \b in a class,
# unescaped braces), with repeat counts small enough to compile at once.
_MAX_TRIGGER_REPEAT: Final = 1000


class _TriggerPatternParser(_RegexParser):
    def group(self) -> _RNode:
        if self.src.startswith("(?<", self.pos) and not self.src.startswith(("(?<=", "(?<!"), self.pos):
            raise self.fail("named groups are not supported")
        return super().group()

    def atom(self) -> _RNode:
        if self.peek() in ("{", "}"):
            raise self.fail("a literal brace must be escaped")
        return super().atom()

    def escape(self, in_class: bool) -> Intervals:
        if self.peek() == "0" or (in_class and self.peek() == "b"):
            raise self.fail(f"\\{self.peek()} is not supported here")
        return super().escape(in_class)

    def quantified(self) -> _RNode:
        node = super().quantified()
        if isinstance(node, _RRep) and max(node.lo, node.hi or 0) > _MAX_TRIGGER_REPEAT:
            raise self.fail(f"repeat counts above {_MAX_TRIGGER_REPEAT} are not supported")
        return node


def trigger_pattern_problem(pattern: str, path: str) -> str | None:
    """Why llama.cpp should not be given ``pattern`` as a trigger; None when it may."""
    try:
        _TriggerPatternParser(pattern, path).parse()
    except SchemaError as exc:
        return str(exc)
    return None


def _re_nullable(node: _RNode) -> bool:
    if isinstance(node, _RSet):
        return False
    if isinstance(node, _RSeq):
        return all(_re_nullable(i) for i in node.items)
    if isinstance(node, _RAlt):
        return any(_re_nullable(o) for o in node.options)
    if isinstance(node, _RRep):
        return node.lo == 0 or _re_nullable(node.item)
    return True


def _re_nonempty(node: _RNode) -> _RNode | None:
    """The same language minus the empty string (None if nothing is left).

    Needed because ``X*`` with a nullable ``X`` is left-recursive in llama.cpp's expansion
    (``S' ::= X S' |``), which it rejects; ``X{m,}`` equals ``X'*`` for the non-empty part ``X'``.
    """
    if isinstance(node, _RSet):
        return node
    if isinstance(node, _RAnchor):
        return None
    if isinstance(node, _RAlt):
        opts = [o for o in (_re_nonempty(x) for x in node.options) if o is not None]
        return None if not opts else opts[0] if len(opts) == 1 else _RAlt(tuple(opts))
    if isinstance(node, _RRep):
        if node.hi == 0:
            return None
        if not _re_nullable(node.item):
            return _RRep(node.item, max(node.lo, 1), node.hi)
        inner = _re_nonempty(node.item)
        return None if inner is None else _RRep(inner, 1, node.hi)
    # A non-empty word of a sequence has a first non-empty component i; all before it are empty.
    opts = []
    for i, item in enumerate(node.items):
        first = _re_nonempty(item)
        if first is not None:
            opts.append(_RSeq((first, *node.items[i + 1 :])))
        if not _re_nullable(item):
            break
    return None if not opts else opts[0] if len(opts) == 1 else _RAlt(tuple(opts))


def _re_len(node: _RNode) -> tuple[int, int | None]:
    """Minimum and maximum length (None = unbounded) of the strings ``node`` matches."""
    if isinstance(node, _RSet):
        return 1, 1
    if isinstance(node, _RAnchor):
        return 0, 0
    if isinstance(node, _RSeq):
        lo, hi = 0, 0
        unbounded = False
        for item in node.items:
            a, b = _re_len(item)
            lo += a
            if b is None:
                unbounded = True
            else:
                hi += b
        return lo, None if unbounded else hi
    if isinstance(node, _RAlt):
        lens = [_re_len(o) for o in node.options]
        his = [b for _, b in lens]
        lo = min(a for a, _ in lens)
        return lo, None if None in his else max(b for b in his if b is not None)
    a, b = _re_len(node.item)
    if node.hi == 0:
        return 0, 0
    if node.hi is None:
        return node.lo * a, (0 if b == 0 else None)
    return node.lo * a, None if b is None else node.hi * b


def _re_branches(node: _RNode, path: str) -> list[_RNode]:
    """Split top-level alternatives, resolve their ``^``/``$`` anchors, and make the implicit
    "anything may come before/after" of an unanchored side explicit."""
    options = node.options if isinstance(node, _RAlt) else (node,)
    out: list[_RNode] = []
    for opt in options:
        items = list(opt.items) if isinstance(opt, _RSeq) else [opt]
        anchored_start = anchored_end = False
        while items and isinstance(items[0], _RAnchor) and items[0].start:
            items.pop(0)
            anchored_start = True
        while items and isinstance(items[-1], _RAnchor) and not items[-1].start:
            items.pop()
            anchored_end = True
        if any(_re_has_anchor(i) for i in items):
            raise _err(path, "'^' and '$' are only supported at the start and end of the pattern")
        anything = _RRep(_ANY_CHAR, 0, None)
        if not anchored_start:
            items.insert(0, anything)
        if not anchored_end and not (items and items[-1] == anything):
            items.append(anything)
        out.append(items[0] if len(items) == 1 else _RSeq(tuple(items)))
    return out


def _re_has_anchor(node: _RNode) -> bool:
    if isinstance(node, _RAnchor):
        return True
    if isinstance(node, _RSeq):
        return any(_re_has_anchor(i) for i in node.items)
    if isinstance(node, _RAlt):
        return any(_re_has_anchor(o) for o in node.options)
    if isinstance(node, _RRep):
        return _re_has_anchor(node.item)
    return False


def _re_cap(node: _RNode, budget: int) -> _RNode | None:
    """A sub-language of ``node`` whose strings are all at most ``budget`` long (None if none).

    Repetitions are narrowed: a sequence shares the spare length among its variable parts, a
    repetition of a fixed-width unit keeps as many copies as fit, and a repetition of a
    variable-width unit keeps a few copies, each capped. The result is a subset -- strictly
    valid -- though not always the largest one.
    """
    lo, hi = _re_len(node)
    if hi is not None and hi <= budget:
        return node
    if lo > budget:
        return None
    if isinstance(node, _RAlt):
        opts = [c for c in (_re_cap(o, budget) for o in node.options) if c is not None]
        return None if not opts else opts[0] if len(opts) == 1 else _RAlt(tuple(opts))
    if isinstance(node, _RSeq):
        lens = [_re_len(it) for it in node.items]
        caps = [a for a, _ in lens]
        slack = budget - sum(caps)

        def spread(i: int) -> float:
            a, b = lens[i]
            return math.inf if b is None else b - a

        # Parts that can grow least are served first, so the rest goes to the open-ended ones.
        growable = sorted((i for i, (a, b) in enumerate(lens) if b != a), key=spread)
        for n_left, i in zip(range(len(growable), 0, -1), growable, strict=True):
            a, b = lens[i]
            give = slack // n_left if b is None else min(b - a, slack // n_left)
            caps[i] += give
            slack -= give
        items = [_re_cap(it, cap) for it, cap in zip(node.items, caps, strict=True)]
        if any(it is None for it in items):
            return None
        return _RSeq(tuple(it for it in items if it is not None))
    if isinstance(node, _RRep):
        unit_lo, unit_hi = _re_len(node.item)
        most = budget // max(unit_lo, 1)
        if node.hi is not None:
            most = min(most, node.hi)
        if unit_lo == unit_hi:
            return _RRep(node.item, node.lo, most) if most >= node.lo else None
        if unit_hi is not None and budget // unit_hi >= max(node.lo, 1):
            return _RRep(node.item, node.lo, min(most, budget // unit_hi))  # whole units fit
        copies = max(node.lo, min(most, 4))
        if copies == 0:
            return _RRep(node.item, 0, 0)
        item = _re_cap(node.item, budget // copies)
        return None if item is None else _RRep(item, node.lo, copies)
    return None


def _re_raise(node: _RNode, need: int) -> _RNode | None:
    """A sub-language of ``node`` whose strings are all at least ``need`` long (None if not
    found): repetitions are made to repeat more."""
    lo, hi = _re_len(node)
    if lo >= need:
        return node
    if hi is not None and hi < need:
        return None
    if isinstance(node, _RAlt):
        opts = [c for c in (_re_raise(o, need) for o in node.options) if c is not None]
        return None if not opts else opts[0] if len(opts) == 1 else _RAlt(tuple(opts))
    if isinstance(node, _RSeq):
        items = list(node.items)
        deficit = need - lo
        for i, it in enumerate(items):
            if deficit <= 0:
                break
            a, b = _re_len(it)
            grow = deficit if b is None else min(deficit, b - a)
            raised = _re_raise(it, a + grow) if grow > 0 else None
            if raised is not None:
                items[i] = raised
                deficit -= _re_len(raised)[0] - a
        return _RSeq(tuple(items)) if deficit <= 0 else None
    if isinstance(node, _RRep):
        item = node.item if _re_len(node.item)[0] > 0 else _re_nonempty(node.item)
        if item is None:
            return None
        unit = _re_len(item)[0]
        copies = -(-need // unit)
        if node.hi is None or copies <= node.hi:
            return _RRep(item, max(node.lo, copies), node.hi)
        longer = _re_raise(item, -(-need // node.hi))
        return None if longer is None else _RRep(longer, node.hi, node.hi)
    return None


def _re_fit_length(branch: _RNode, min_len: int, max_len: int | None) -> _RNode | None:
    """A sub-language of one anchored branch within the length range, or None if none found."""
    fitted: _RNode | None = branch
    if max_len is not None:
        fitted = _re_cap(branch, max_len)
    if fitted is not None and min_len > 0:
        fitted = _re_raise(fitted, min_len)
    if fitted is None:
        return None
    lo, hi = _re_len(fitted)
    assert lo >= min_len and (max_len is None or (hi is not None and hi <= max_len))
    return fitted


# Format grammars, written as regexes so the pattern compiler (and its length analysis) is reused.
# Years 0001-9999 (Python's date type, used by validators, has no year 0), real month lengths,
# and Feb 29 only in leap years.
_DATE_RE: Final = (
    r"(?:(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-(?:(?:0[13578]|1[02])-"
    r"(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))"
    r"|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)-02-29)"
)
_TIME_RE: Final = (
    r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?"
    r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)
_OCTET_RE: Final = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_FORMATS: Final[dict[str, str]] = {
    "date": f"^{_DATE_RE}$",
    "time": f"^{_TIME_RE}$",
    "date-time": f"^{_DATE_RE}T{_TIME_RE}$",
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "email": (
        r"^[A-Za-z0-9_%+-]+(?:\.[A-Za-z0-9_%+-]+)*"
        r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}$"
    ),
    "ipv4": rf"^(?:{_OCTET_RE}\.){{3}}{_OCTET_RE}$",
}
