"""Kimi K2 (Instruct, Thinking):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

The call id is the model's ``functions.NAME:IDX`` (Kimi's template writes it back in tool
results, as the model was trained to see it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._base import Ctx, Gen, blocks_in_content, json_value, literal, read_until, skip_ws, wait
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, lit, regex_escape, repeat_calls

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
_ID_BAD = re.compile(r"[\s<>{}\"]")
_SUFFIX = re.compile(r":\d+\Z")


def _call(ctx: Ctx) -> Gen:
    """One call, after its begin tag."""
    got = yield from read_until(ctx, (ARG_BEGIN,), limit=256, charset=_ID_BAD)
    if got is None or got[1] is None:
        return False
    call_id = got[0].strip()
    name = call_id[len("functions.") :] if call_id.startswith("functions.") else call_id
    m = _SUFFIX.search(name)
    if m:
        name = name[: m.start()]
    if not ctx.info.accepts(name):
        return False
    yield from skip_ws(ctx)
    if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != "{":
        return False
    yield ctx.start_call(name, call_id)
    if (yield from json_value(ctx, emit_index=ctx.index - 1)) is None:
        return False
    yield from skip_ws(ctx)
    yield from literal(ctx, CALL_END)  # tolerated when missing
    return True


class KimiK2Format(ToolFormat):
    name = "kimi_k2"
    triggers = (regex_escape(SECTION_BEGIN), regex_escape(CALL_BEGIN))

    def run(self, ctx: Ctx) -> Gen:
        def block(opener: str) -> Gen:
            if opener == SECTION_BEGIN:
                yield from literal(ctx, opener)
            n = 0
            while True:
                yield from skip_ws(ctx)
                if n and (yield from literal(ctx, SECTION_END)):
                    return True
                if not (yield from literal(ctx, CALL_BEGIN)):
                    return n > 0
                if not (yield from _call(ctx)):
                    return False
                n += 1

        yield from blocks_in_content(ctx, (SECTION_BEGIN, CALL_BEGIN), block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        g.add("call-idx", "[0-9]{1,4}")
        calls_ = [
            g.add(
                f"call-{i}", f"{lit(CALL_BEGIN + 'functions.' + n + ':')} call-idx {lit(ARG_BEGIN)} {a} {lit(CALL_END)}"
            )
            for i, (n, a) in enumerate(rules)
        ]
        calls = repeat_calls(g.add("call", alt(calls_)), parallel, SP)
        if lazy:
            return f"({lit(SECTION_BEGIN)} {SP})? {calls} ({SP} {lit(SECTION_END)})? {SP}"
        return f"{SP} {lit(SECTION_BEGIN)} {calls} {lit(SECTION_END)} {SP}"
