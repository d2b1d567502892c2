"""Mistral: ``[TOOL_CALLS]`` followed by either a JSON array (Mistral Nemo, Small 3.1 and
older: ``[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "abc123XYZ"}]``) or the newer
per-call form (Devstral, Small 3.2, Ministral 3, Magistral):
``[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`` (optionally ``name[CALL_ID]id[ARGS]{...}``),
repeated for parallel calls. Both are always parsed; the grammar follows the template's style.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._base import (
    Ctx,
    Gen,
    blocks_in_content,
    json_call_object,
    json_value,
    literal,
    parse_json_array_of_calls,
    read_until,
    skip_ws,
    wait,
)
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, json_call_body, lit, repeat_calls

OPEN = "[TOOL_CALLS]"
_NAME_BAD = re.compile(r"[\s\[\]{}\"<>]")


class MistralFormat(ToolFormat):
    name = "mistral"
    triggers = (r"\[TOOL_CALLS\]",)

    def __init__(self, name: str = "mistral", json_array: bool = False) -> None:
        self.name = name
        self.json_array = json_array  # the grammar writes the older JSON-array form

    def run(self, ctx: Ctx) -> Gen:
        def block(opener: str) -> Gen:
            yield from literal(ctx, OPEN)
            yield from skip_ws(ctx)
            if not (yield from wait(ctx)):
                return False
            if ctx.buf[ctx.pos] == "[":
                return (yield from parse_json_array_of_calls(ctx, lambda: json_call_object(ctx)))
            got = yield from read_until(ctx, ("[ARGS]", "[CALL_ID]"), limit=256, charset=_NAME_BAD)
            if got is None or got[1] is None or not ctx.info.accepts(got[0]):
                return False
            name, call_id = got[0], ""
            if got[1] == "[CALL_ID]":
                got = yield from read_until(ctx, ("[ARGS]",), limit=64, charset=_NAME_BAD)
                if got is None or got[1] is None:
                    return False
                call_id = got[0]
            yield from skip_ws(ctx)
            if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != "{":
                return False
            yield ctx.start_call(name, call_id)
            return (yield from json_value(ctx, emit_index=ctx.index - 1)) is not None

        yield from blocks_in_content(ctx, (OPEN,), block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        if self.json_array:
            g.add("call-id", '"\\"" [a-zA-Z0-9]{9} "\\""')
            objs = [
                g.add(f"obj-{i}", json_call_body(n, a, extra=f'{SP} "," {SP} "\\"id\\"" {SP} ":" {SP} call-id'))
                for i, (n, a) in enumerate(rules)
            ]
            obj = g.add("call-obj", alt(objs))
            inner = repeat_calls(obj, parallel, f'{SP} ","')
            body = f'{lit(OPEN)} "[" {SP} {inner} {SP} "]"'
        else:
            calls = [g.add(f"call-{i}", f'{lit(OPEN)} {lit(n)} "[ARGS]" {a}') for i, (n, a) in enumerate(rules)]
            body = repeat_calls(g.add("call", alt(calls)), parallel, SP)
        return f"{body} {SP}" if lazy else f"{SP} {body} {SP}"
