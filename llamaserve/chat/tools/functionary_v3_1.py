"""Functionary v3.1 (Llama 3.1 based): ``<function=NAME>{json}</function>`` after optional
content, and ``<|python_tag|>code`` for the built-in ``python`` tool."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ._base import (
    Ctx,
    Gen,
    blocks_in_content,
    emit_call,
    json_value,
    literal,
    read_until,
    skip_ws,
    wait,
)
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, lit, repeat_calls

PYTHON_TAG = "<|python_tag|>"
_NAME_BAD = re.compile(r"[\s<>{}\"]")


class FunctionaryV31Format(ToolFormat):
    name = "functionary_v3_1"
    triggers = ("<function=",)

    def run(self, ctx: Ctx) -> Gen:
        def block(opener: str) -> Gen:
            yield from literal(ctx, opener)
            if opener == PYTHON_TAG:
                got = yield from read_until(ctx, ("<|eom_id|>", "<|eot_id|>"))
                if got is None or not (ctx.info.accepts("python")):
                    return False
                yield from emit_call(ctx, "python", json.dumps({"code": got[0]}, ensure_ascii=False))
                return True
            got = yield from read_until(ctx, (">",), limit=256, charset=_NAME_BAD)
            if got is None or got[1] is None or not ctx.info.accepts(got[0]):
                return False
            yield from skip_ws(ctx)
            if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != "{":
                return False
            yield ctx.start_call(got[0])
            if (yield from json_value(ctx, emit_index=ctx.index - 1)) is None:
                return False
            yield from skip_ws(ctx)
            yield from literal(ctx, "</function>")  # tolerated when missing
            return True

        yield from blocks_in_content(ctx, ("<function=", PYTHON_TAG), block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        calls_ = [
            g.add(f"call-{i}", f'{lit("<function=" + n + ">")} {a} {SP} "</function>"')
            for i, (n, a) in enumerate(rules)
        ]
        calls = repeat_calls(g.add("call", alt(calls_)), parallel, SP)
        return f"{calls} {SP}" if lazy else f"{SP} {calls} {SP}"
