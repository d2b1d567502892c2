"""Upstage Solar Open:

    <|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>get_weather<|tool_call:args|>{"city": "Paris"}<|tool_call:end|>…

The model writes its own call ids; they are reported.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._base import Ctx, Gen, blocks_in_content, json_value, literal, read_until, skip_ws, wait
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, lit, regex_escape, repeat_calls

SECTION = "<|tool_calls|>"
BEGIN, NAME, ARGS, END = "<|tool_call:begin|>", "<|tool_call:name|>", "<|tool_call:args|>", "<|tool_call:end|>"
_BAD = re.compile(r"[\s<>{}\"]")


def _call(ctx: Ctx) -> Gen:
    got = yield from read_until(ctx, (NAME,), limit=64, charset=_BAD)
    if got is None or got[1] is None:
        return False
    call_id = got[0]
    got = yield from read_until(ctx, (ARGS,), limit=256, charset=_BAD)
    if got is None or got[1] is None or not ctx.info.accepts(got[0]):
        return False
    yield from skip_ws(ctx)
    if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != "{":
        return False
    yield ctx.start_call(got[0], call_id)
    if (yield from json_value(ctx, emit_index=ctx.index - 1)) is None:
        return False
    yield from skip_ws(ctx)
    yield from literal(ctx, END)
    return True


class SolarOpenFormat(ToolFormat):
    name = "solar_open"
    triggers = (regex_escape(SECTION), regex_escape(BEGIN))

    def run(self, ctx: Ctx) -> Gen:
        def block(opener: str) -> Gen:
            if opener == SECTION:
                yield from literal(ctx, SECTION)
            n = 0
            while True:
                yield from skip_ws(ctx)
                if not (yield from literal(ctx, BEGIN)):
                    return n > 0
                if not (yield from _call(ctx)):
                    return False
                n += 1

        yield from blocks_in_content(ctx, (SECTION, BEGIN), block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        g.add("call-id", "[a-zA-Z0-9]{9}")
        calls_ = [
            g.add(f"call-{i}", f"{lit(BEGIN)} call-id {lit(NAME + n + ARGS)} {a} {lit(END)}")
            for i, (n, a) in enumerate(rules)
        ]
        calls = repeat_calls(g.add("call", alt(calls_)), parallel, SP)
        return f"({lit(SECTION)})? {calls} {SP}" if lazy else f"{SP} {lit(SECTION)} {calls} {SP}"
