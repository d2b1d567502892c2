"""The rule book of one GBNF grammar under construction: fresh rule names, rules shared by
body, the size and time budget every conversion is held to, and repetition counts of any size
written so that llama.cpp never sees one near its 2000-repetition limit."""

from __future__ import annotations

import re
import time

from llamaserve.grammar.common import _DIRECT_REPEAT, _err
from llamaserve.grammar.gbnf import _BUILTINS, _RULE_NAME_RE, _is_symbol, _llama_cost, _rep_suffix, _seq, _strip_group


class RuleBook:
    """The rules written so far (name -> body) and what they cost against the budget."""

    def __init__(self, *, max_rules: int, max_grammar_bytes: int, deadline_s: float) -> None:
        self.max_rules = max_rules
        self.max_bytes = max_grammar_bytes
        self.deadline_s = deadline_s
        self.deadline = time.monotonic() + deadline_s
        self.rules: dict[str, str] = {}
        self.by_body: dict[str, str] = {}
        self.name_counter: dict[str, int] = {}
        self.rule_count = 0
        self.byte_count = 0
        self.block_rules: dict[tuple[str, int], str] = {}
        self.free_rules: dict[tuple[str, int], str] = {}

    # ---- budget ----------------------------------------------------------------------------

    def tick(self, path: str) -> None:
        if time.monotonic() > self.deadline:
            raise _err(path, f"conversion exceeded the time budget of {self.deadline_s:g} s")

    def charge(self, path: str, rules: int, nbytes: int) -> None:
        self.rule_count += rules
        self.byte_count += nbytes
        if self.rule_count > self.max_rules:
            raise _err(path, f"grammar exceeds the size budget of {self.max_rules} rules")
        if self.byte_count > self.max_bytes:
            raise _err(path, f"grammar exceeds the size budget of {self.max_bytes} bytes")

    # ---- rules -----------------------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        base = re.sub(r"[^A-Za-z0-9]+", "-", hint).strip("-")[:48].strip("-") or "r"
        name, n = base, self.name_counter.get(base, 1)
        while name in self.rules or name in _BUILTINS:
            n += 1
            name = f"{base}-{n}"
        self.name_counter[base] = n  # next time, start where this search ended
        self.rules[name] = ""  # reserved until defined
        return name

    def define(self, name: str, body: str, path: str) -> None:
        body = _strip_group(body)
        self.charge(path, 1 + _llama_cost(body), len(name) + len(body) + 6)
        self.rules[name] = body
        self.by_body.setdefault(body, name)

    def rule(self, hint: str, body: str, path: str) -> str:
        """A symbol for ``body``: the body itself if it is one rule name, else a (shared) rule."""
        body = _strip_group(body)
        if _RULE_NAME_RE.fullmatch(body):
            return body
        if body in self.by_body:
            return self.by_body[body]
        name = self.fresh(hint)
        self.define(name, body, path)
        return name

    def symbol(self, expr: str, hint: str, path: str) -> str:
        return expr if _is_symbol(expr) else self.rule(hint, expr, path)

    def builtin(self, name: str) -> str:
        if name not in self.rules:
            body, deps = _BUILTINS[name]
            self.rules[name] = body
            self.charge("#", 1 + _llama_cost(body), len(name) + len(body) + 6)
            for dep in deps:
                self.builtin(dep)
        return name

    # ---- repetition ------------------------------------------------------------------------

    def repeat(self, sym: str, lo: int, hi: int | None, path: str) -> str:
        """``sym`` repeated lo..hi times (hi None = unbounded); ``sym`` is one non-nullable symbol.

        Small counts use ``{m,n}`` directly. Large ones are written in base 10: blocks of 10^k
        copies for the mandatory part, and a digit-by-digit "at most r" construction for the
        optional part, so the grammar grows with log(count) and llama.cpp never sees a
        repetition count anywhere near its 2000 limit.
        """
        if (hi is not None and hi <= _DIRECT_REPEAT) or (hi is None and lo <= _DIRECT_REPEAT):
            if hi == 0:
                return ""
            return sym if (lo, hi) == (1, 1) else sym + _rep_suffix(lo, hi)
        base = sym if _RULE_NAME_RE.fullmatch(sym) else self.rule("rep", sym, path)
        mandatory = self.mandatory(base, lo, path)
        if hi is None:
            return _seq(mandatory, f"{base}*")
        return _seq(mandatory, self.at_most(base, hi - lo, path))

    def block(self, base: str, k: int, path: str) -> str:
        """A rule matching exactly 10^k copies of ``base``."""
        if k == 0:
            return base
        key = (base, k)
        if key not in self.block_rules:
            name = self.fresh(f"{base}-x{10**k}")
            self.define(name, f"{self.block(base, k - 1, path)}{{10}}", path)
            self.block_rules[key] = name
        return self.block_rules[key]

    def free(self, base: str, k: int, path: str) -> str:
        """Any count of ``base`` in 0 .. 10^k - 1 ("" for k == 0)."""
        if k == 0:
            return ""
        key = (base, k)
        if key not in self.free_rules:
            name = self.fresh(f"{base}-lt{10**k}")
            body = _seq(f"{self.block(base, k - 1, path)}{{0,9}}", self.free(base, k - 1, path))
            self.define(name, body, path)
            self.free_rules[key] = name
        return self.free_rules[key]

    def mandatory(self, base: str, count: int, path: str) -> str:
        if count <= _DIRECT_REPEAT:
            return "" if count == 0 else base if count == 1 else f"{base}{{{count}}}"
        digits = str(count)
        parts = []
        for pos, ch in enumerate(digits):
            d = int(ch)
            if d:
                blk = self.block(base, len(digits) - 1 - pos, path)
                parts.append(blk if d == 1 else f"{blk}{{{d}}}")
        return _seq(*parts)

    def at_most(self, base: str, count: int, path: str) -> str:
        if count <= _DIRECT_REPEAT:
            return "" if count == 0 else f"{base}{_rep_suffix(0, count)}"
        EMPTY = '""'
        digits = str(count)
        top = len(digits) - 1
        expr = ""  # "at most the value of the digits below this position"
        for k in range(top + 1):
            d = int(digits[top - k])
            if d == 0:
                continue  # this digit of the count must be 0: nothing to emit
            blk = self.block(base, k, path)
            smaller = _seq(blk + _rep_suffix(0, d - 1) if d > 1 else "", self.free(base, k, path))
            equal = _seq(blk if d == 1 else f"{blk}{{{d}}}", expr)
            expr = f"({smaller or EMPTY} | {equal})"
        return expr
