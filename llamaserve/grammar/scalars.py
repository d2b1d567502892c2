"""The JSON Schema converter's rules for scalar values: strings (lengths, ``pattern``, ``format``),
integers and numbers (their bounds). Each method returns the GBNF body of one value, trailing
whitespace included; json_schema's walk picks the method by the schema's type."""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from llamaserve.grammar.common import _count, _decimal, _err, _ptr, _unsat
from llamaserve.grammar.gbnf import _group, _json_char_expr, _json_text_literal, _seq
from llamaserve.grammar.patterns import (
    _FORMATS,
    _RAlt,
    _re_branches,
    _re_fit_length,
    _re_len,
    _re_nonempty,
    _re_nullable,
    _RegexParser,
    _RNode,
    _RRep,
    _RSeq,
    _RSet,
)
from llamaserve.grammar.ranges import _SIGNIFICANT_DIGITS, _int_range_alts, _number_range_alts
from llamaserve.grammar.rulebook import RuleBook


class ScalarRules(RuleBook):
    """Strings, integers and numbers: leaves of the schema, which visit nothing below them."""

    # ---- strings ---------------------------------------------------------------------------

    def string(self, s: Mapping[str, Any], path: str, hint: str) -> str:
        min_len = _count(s, "minLength", path) or 0
        max_len = _count(s, "maxLength", path)
        if max_len is not None and max_len < min_len:
            raise _unsat(path, "maxLength is smaller than minLength")
        pattern = s.get("pattern")
        fmt = s.get("format")
        ws = self.builtin("ws")
        branches: list[_RNode] | None = None
        if pattern is not None and fmt in _FORMATS:
            # Two regular languages cannot be intersected in a grammar this simple; rather than
            # drop the format (which format-asserting validators check), refuse.
            raise _err(_ptr(path, "format"), f"format {fmt!r} together with a pattern is not supported")
        # A format is a pattern of ours: both become regex branches fitted to the length limits.
        regex: tuple[str, str] | None = None
        if pattern is not None:
            if not isinstance(pattern, str):
                raise _err(_ptr(path, "pattern"), "expected a string")
            regex = pattern, _ptr(path, "pattern")
        elif fmt in _FORMATS:
            regex = _FORMATS[fmt], _ptr(path, "format")
        if regex is not None:
            source, rpath = regex
            node = _RegexParser(source, rpath).parse()
            branches = self.fit_branches(_re_branches(node, rpath), min_len, max_len, rpath)
        if branches is None:
            if min_len == 0 and max_len is None:
                return self.builtin("string")
            content = self.repeat(self.builtin("char"), min_len, max_len, path)
        else:
            exprs = [self.regex(b, f"{hint}-re", path) for b in branches]
            content = exprs[0] if len(exprs) == 1 else "(" + " | ".join(exprs) + ")"
        return _seq(r'"\""', content, r'"\""', ws)

    @staticmethod
    def fit_branches(branches: list[_RNode], min_len: int, max_len: int | None, path: str) -> list[_RNode]:
        if min_len == 0 and max_len is None:
            return branches
        fitted = [b for b in (_re_fit_length(x, min_len, max_len) for x in branches) if b is not None]
        if fitted:
            return fitted
        if all(
            _re_len(b)[0] > (max_len if max_len is not None else math.inf) or (_re_len(b)[1] or math.inf) < min_len
            for b in branches
        ):
            raise _unsat(path, "no string matches both the pattern and the length limits")
        raise _err(path, "cannot combine this pattern with minLength/maxLength")

    def regex(self, node: _RNode, hint: str, path: str) -> str:
        """GBNF for the JSON-encoded text of the strings ``node`` matches."""
        self.tick(path)
        if isinstance(node, _RSet):
            if len(node.chars) == 1 and node.chars[0][0] == node.chars[0][1]:
                return _json_text_literal(chr(node.chars[0][0]))
            expr = _json_char_expr(node.chars)
            if expr is None:
                raise _unsat(path, "character class matches nothing")
            return expr
        if isinstance(node, _RSeq):
            parts: list[str] = []
            text = ""
            for child in node.items:
                if isinstance(child, _RSet) and len(child.chars) == 1 and (child.chars[0][0] == child.chars[0][1]):
                    text += chr(child.chars[0][0])  # runs of literal characters: one literal
                    continue
                if text:
                    parts.append(_json_text_literal(text))
                    text = ""
                parts.append(_group(self.regex(child, hint, path)))
            if text:
                parts.append(_json_text_literal(text))
            return _seq(*parts) or '""'
        if isinstance(node, _RAlt):
            return "(" + " | ".join(self.regex(o, hint, path) for o in node.options) + ")"
        if isinstance(node, _RRep):
            item: _RNode | None = node.item
            lo, hi = node.lo, node.hi
            if _re_nullable(node.item):
                # X{m,n} == X'{0,n} for the non-empty part X' (pad with empty words).
                item, lo = _re_nonempty(node.item), 0
            if item is None or hi == 0:
                return '""'
            sym = self.symbol(self.regex(item, hint, path), hint, path)
            return self.repeat(sym, lo, hi, path) or '""'
        return '""'  # pragma: no cover - anchors are removed before conversion

    # ---- numbers ---------------------------------------------------------------------------

    def integer(self, s: Mapping[str, Any], path: str) -> str:
        lo: int | None = None
        hi: int | None = None
        if "minimum" in s:
            lo = math.ceil(_decimal(s["minimum"], _ptr(path, "minimum")))
        if "exclusiveMinimum" in s:
            v = math.floor(_decimal(s["exclusiveMinimum"], _ptr(path, "exclusiveMinimum"))) + 1
            lo = v if lo is None else max(lo, v)
        if "maximum" in s:
            hi = math.floor(_decimal(s["maximum"], _ptr(path, "maximum")))
        if "exclusiveMaximum" in s:
            v = math.ceil(_decimal(s["exclusiveMaximum"], _ptr(path, "exclusiveMaximum"))) - 1
            hi = v if hi is None else min(hi, v)
        if lo is None and hi is None:
            return self.builtin("integer")
        if lo is not None and hi is not None and lo > hi:
            raise _unsat(path, "no integer lies within the bounds")
        alts = _int_range_alts(lo, hi)
        return f"({' | '.join(alts)}) {self.builtin('ws')}"

    def number(self, s: Mapping[str, Any], path: str) -> str:
        lo: Decimal | None = None
        lo_excl = False
        hi: Decimal | None = None
        hi_excl = False
        for key, excl in (("minimum", False), ("exclusiveMinimum", True)):
            if key in s:
                v = _decimal(s[key], _ptr(path, key))
                if lo is None or v > lo or (v == lo and excl):
                    lo, lo_excl = v, excl
        for key, excl in (("maximum", False), ("exclusiveMaximum", True)):
            if key in s:
                v = _decimal(s[key], _ptr(path, key))
                if hi is None or v < hi or (v == hi and excl):
                    hi, hi_excl = v, excl
        if lo is None and hi is None:
            return self.builtin("number")
        if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_excl or hi_excl))):
            raise _unsat(path, "no number lies within the bounds")
        alts = _number_range_alts(lo, lo_excl, hi, hi_excl)
        if not alts:
            raise _err(
                path,
                f"no number within the bounds can be written with at most {_SIGNIFICANT_DIGITS} significant digits",
            )
        return f"({' | '.join(alts)}) {self.builtin('ws')}"
