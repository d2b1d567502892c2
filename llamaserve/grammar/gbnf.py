"""GBNF text for the JSON Schema converter: code-point intervals, character classes,
literals, repetition suffixes, rule-size estimates and the shared JSON rules."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Final, TypeAlias

# --------------------------------------------------------------------------------------------
# GBNF text helpers.

Intervals: TypeAlias = tuple[tuple[int, int], ...]
_MAX_CP: Final = 0x10FFFF
_RULE_NAME_RE: Final = re.compile(r"[A-Za-z0-9-]+")
_LITERAL_RE: Final = re.compile(r'"(?:[^"\\]|\\.)*"')
_CLASS_RE: Final = re.compile(r"\[(?:[^\]\\]|\\.)*\]")


def _iv(pairs: Iterable[tuple[int, int]]) -> Intervals:
    """Sort and merge code-point intervals (inclusive bounds)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(p for p in pairs if p[0] <= p[1]):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _iv_complement(iv: Intervals) -> Intervals:
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in iv:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= _MAX_CP:
        out.append((nxt, _MAX_CP))
    return tuple(out)


def _iv_intersect(a: Intervals, b: Intervals) -> Intervals:
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def _iv_contains(iv: Intervals, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in iv)


def _gbnf_char(cp: int, in_class: bool) -> str:
    """One code point inside a GBNF literal or class, escaped so llama.cpp's parser reads it back.

    Everything outside printable ASCII is written as an escape so the grammar text is pure ASCII
    (no question of how the C side decodes UTF-8 in the grammar source).
    """
    specials = '\\"[]-^' if in_class else '\\"'
    ch = chr(cp)
    if 0x20 <= cp < 0x7F and ch not in specials:
        return ch
    if ch == "\\":
        return "\\\\"
    if ch == '"':
        return '\\"'
    if cp == 0x0A:
        return "\\n"
    if cp == 0x09:
        return "\\t"
    if cp == 0x0D:
        return "\\r"
    if cp < 0x100:
        return f"\\x{cp:02X}"
    if cp < 0x10000:
        return f"\\u{cp:04X}"
    return f"\\U{cp:08X}"


def _gbnf_literal(text: str) -> str:
    return '"' + "".join(_gbnf_char(ord(c), False) for c in text) + '"'


def _gbnf_class(iv: Intervals, negate: bool = False) -> str:
    parts = []
    for lo, hi in iv:
        parts.append(_gbnf_char(lo, True))
        if hi > lo:
            # Two adjacent code points are written as two members: a range of two is no shorter.
            parts.append(("-" if hi > lo + 1 else "") + _gbnf_char(hi, True))
    return "[" + ("^" if negate else "") + "".join(parts) + "]"


def _class_expr(iv: Intervals) -> str:
    """The shorter of ``[...]`` and ``[^...]`` for a non-empty set."""
    comp = _iv_complement(iv)
    return _gbnf_class(iv) if len(iv) < len(comp) else _gbnf_class(comp, negate=True)


def _json_text_literal(value: str) -> str:
    """GBNF literal matching the JSON-encoded form of ``value`` *without* surrounding quotes."""
    return _gbnf_literal(json.dumps(value, ensure_ascii=False)[1:-1])


# Characters that JSON strings cannot contain raw: the quote, the backslash, and C0 controls.
_JSON_SPECIAL: Final = _iv([(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])


def _json_char_expr(iv: Intervals) -> str | None:
    """GBNF for one *decoded* string character from ``iv``, as it appears inside a JSON string.

    Raw characters are allowed as themselves; the quote, the backslash and control characters only
    in their escaped forms. Other characters are never offered as ``\\u`` escapes (a stricter but
    still valid grammar). Returns None when ``iv`` is empty.
    """
    alts: list[str] = []
    raw = _iv_intersect(iv, _iv_complement(_JSON_SPECIAL))
    if raw:
        alts.append(_class_expr(raw))
    for cp in (0x22, 0x5C):
        if _iv_contains(iv, cp):
            alts.append(_json_text_literal(chr(cp)))
    controls = _iv_intersect(iv, ((0x00, 0x1F),))
    if controls == ((0x00, 0x1F),):
        # Every control character: the short escapes plus the \uXXXX form that covers them all.
        alts.append(r'"\\" ([bfnrt] | "u00" [01] [0-9a-fA-F])')
    else:
        for lo, hi in controls:
            alts.extend(_json_text_literal(chr(cp)) for cp in range(lo, hi + 1))
    if not alts:
        return None
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def _strip_group(expr: str) -> str:
    """``(x | y)`` -> ``x | y`` when the parentheses enclose the whole expression (a rule body
    needs no group, and each group costs llama.cpp a rule)."""
    if not expr.startswith("(") or not expr.endswith(")"):
        return expr
    depth = 0
    i = 0
    while i < len(expr):
        c = expr[i]
        if c in '"[':
            close = '"' if c == '"' else "]"
            i += 1
            while expr[i] != close:
                i += 2 if expr[i] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0 and i != len(expr) - 1:
                return expr
        i += 1
    return expr[1:-1]


def _json_value_gbnf(value: Any, ws: str) -> str:
    """GBNF for one fixed JSON value, with optional whitespace between its tokens (none after)."""
    if isinstance(value, dict):
        if not value:
            return f'"{{" {ws} "}}"'
        members = [
            f'{_gbnf_literal(json.dumps(k, ensure_ascii=False))} {ws} ":" {ws} {_json_value_gbnf(v, ws)} {ws}'
            for k, v in value.items()
        ]
        return f'"{{" {ws} ' + f' "," {ws} '.join(members) + ' "}"'
    if isinstance(value, list):
        if not value:
            return f'"[" {ws} "]"'
        items = [f"{_json_value_gbnf(v, ws)} {ws}" for v in value]
        return f'"[" {ws} ' + f' "," {ws} '.join(items) + ' "]"'
    return _gbnf_literal(json.dumps(value, ensure_ascii=False, allow_nan=False))


def _rep_suffix(lo: int, hi: int | None) -> str:
    if (lo, hi) == (0, 1):
        return "?"
    if hi is None:
        return "*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _is_symbol(expr: str) -> bool:
    """True when ``expr`` is one GBNF symbol (rule name, literal or class) safe to repeat.

    llama.cpp multiplies a repeated group's inner rule count by the repetition count and refuses
    the grammar at 2000, so anything repeated is first made a single symbol.
    """
    return bool(_RULE_NAME_RE.fullmatch(expr) or _LITERAL_RE.fullmatch(expr) or _CLASS_RE.fullmatch(expr))


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _group(expr: str) -> str:
    """Parenthesise ``expr`` if it has a top-level alternation (so it can sit inside a sequence)."""
    depth = 0
    i = 0
    while i < len(expr):
        c = expr[i]
        if c in '"[':
            close = '"' if c == '"' else "]"
            i += 1
            while expr[i] != close:
                i += 2 if expr[i] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return f"({expr})"
        i += 1
    return expr


def _llama_cost(body: str) -> int:
    """How many rules llama.cpp creates for one rule body, beyond the rule itself.

    Its parser makes one rule per parenthesised group, one per ``? * +`` and ``{m,}``, and n-m
    rules for ``{m,n}``. This is what the ``max_rules`` budget counts, because it is what costs
    memory and time in the sampler.
    """
    cost = 0
    i, n = 0, len(body)
    while i < n:
        c = body[i]
        if c in '"[':
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and body[i] != close:
                i += 2 if body[i] == "\\" else 1
        elif c == "(" or c in "?*+":
            cost += 1
        elif c == "{":
            end = body.index("}", i)
            lo_s, comma, hi_s = body[i + 1 : end].partition(",")
            if comma and hi_s:
                cost += int(hi_s) - int(lo_s)
            elif comma:
                cost += 1
            i = end
        i += 1
    return cost


# Rules every grammar may use; added on demand together with their dependencies.
_BUILTINS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    # One optional whitespace slot: nothing, a space, or one newline plus bounded indentation.
    "ws": (r'| " " | "\n"{1,2} [ \t]{0,20}', ()),
    "value": (
        "object | array | string | number | boolean | null",
        ("object", "array", "string", "number", "boolean", "null"),
    ),
    "object": (r'"{" ws (member ("," ws member)*)? "}" ws', ("ws", "member")),
    "member": (r'string ":" ws value', ("string", "ws", "value")),
    "array": (r'"[" ws (value ("," ws value)*)? "]" ws', ("ws", "value")),
    "string": (r'"\"" char* "\"" ws', ("char", "ws")),
    # Unescaped characters, short escapes, and \u escapes that are not UTF-16 surrogates (a lone
    # surrogate is not a character; astral characters are written raw instead).
    "char": (
        r'[^"\\\x00-\x1F] | "\\" ["\\/bfnrt] | "\\u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | '
        r"[dD] [0-7] [0-9a-fA-F]{2})",
        (),
    ),
    # Digit counts are bounded so a model cannot loop on digits forever.
    "number": (
        r'"-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [+\-]? [0-9]{1,2})? ws',
        ("ws",),
    ),
    "integer": (r'"-"? ("0" | [1-9] [0-9]{0,15}) ws', ("ws",)),
    "boolean": (r'("true" | "false") ws', ("ws",)),
    "null": (r'"null" ws', ("ws",)),
    # Property names offered as "additional": raw characters only, so no escape can spell a
    # declared name.
    "kchar": (r'[^"\\\x00-\x1F]', ()),
    "key-rest": (r'kchar* "\"" ws', ("kchar", "ws")),
}
