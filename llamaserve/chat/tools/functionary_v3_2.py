"""Functionary v3.2 (Llama 3 based): the message is a sequence of sections, each ``NAME\\n``
followed by its body, separated by ``>>>`` (the generation prompt ends with ``>>>``, so the
model's text starts with the first section's name). ``all`` sections are content; other names
are calls with JSON arguments (``python`` also takes raw code, as ``{"code": ...}``).
A message without a section header is plain content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ._base import (
    Ctx,
    Gen,
    emit_call,
    json_value,
    literal,
    read_until,
    rest_as,
    scan_content,
    skip_ws,
    try_block,
    wait,
)
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, lit, regex_escape, repeat_calls

SEP = ">>>"
_NAME_BAD = re.compile(r"[^\w.\-]")


def _call(ctx: Ctx) -> Gen:
    got = yield from read_until(ctx, ("\n",), limit=128, charset=_NAME_BAD)
    if got is None or got[1] is None or not ctx.info.accepts(got[0]):
        return False
    name = got[0]
    yield from skip_ws(ctx)
    if not (yield from wait(ctx)):
        return False
    if ctx.buf[ctx.pos] != "{":
        if name != "python":
            return False
        code = yield from read_until(ctx, (SEP,))
        if code is None:
            return False
        if code[1] is not None:
            ctx.pos -= len(SEP)
        yield from emit_call(ctx, name, json.dumps({"code": code[0]}, ensure_ascii=False))
        return True
    yield ctx.start_call(name)
    return (yield from json_value(ctx, emit_index=ctx.index - 1)) is not None


class FunctionaryV32Format(ToolFormat):
    name = "functionary_v3_2"

    def run(self, ctx: Ctx) -> Gen:
        yield from literal(ctx, SEP)
        while True:
            start = ctx.pos
            got = yield from read_until(ctx, ("\n",), limit=128, charset=_NAME_BAD)
            if got is None or got[1] is None or not got[0]:
                ctx.pos = start
                yield from rest_as(ctx)
                return
            if got[0] == "all":
                if (yield from scan_content(ctx, (SEP,))) is None:
                    return
                ctx.pos += len(SEP)
                ctx.held_ws = ""
                continue
            ctx.pos = start
            if not ctx.tools_ok or not (yield from try_block(ctx, _call(ctx))):
                yield from rest_as(ctx)
                return
            yield from skip_ws(ctx)
            if not (yield from literal(ctx, SEP)):
                yield from rest_as(ctx)
                return

    def lazy_triggers(self, rules: list[ToolRule]) -> tuple[str, ...]:
        names = "|".join(regex_escape(n) for n, _ in rules)
        return (f"^((?:{names})\\n)", f">>>(?:{names})\\n")

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        calls_ = [g.add(f"call-{i}", f"{lit(n + chr(10))} {a}") for i, (n, a) in enumerate(rules)]
        call = g.add("call", alt(calls_))
        calls = repeat_calls(call, parallel, f'{SP} ">>>"')
        return f'">>>"? {calls} {SP}'
