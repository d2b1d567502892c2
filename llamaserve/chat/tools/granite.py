"""IBM Granite 3.x: ``<|tool_call|>[{"name": ..., "arguments": {...}}, ...]`` after optional
content. (Granite 4 uses Hermes ``<tool_call>`` tags: see ``hermes``.) Granite 3.3's thinking
mode wraps the answer in ``<response>…</response>``; those tags are removed from content
(the ``<think>`` part is the reasoning splitter's)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._base import (
    Ctx,
    Gen,
    json_call_object,
    literal,
    parse_json_array_of_calls,
    scan_content,
    try_block,
)
from ._format import ToolFormat, ToolRule
from ._grammar import COMMA, SP, GrammarBuilder, alt, json_call_body, lit, repeat_calls

OPEN = "<|tool_call|>"


class GraniteFormat(ToolFormat):
    name = "granite"
    triggers = (r"<\|tool_call\|>",)

    def run(self, ctx: Ctx) -> Gen:
        markers = ("<response>", "</response>") + ((OPEN,) if ctx.tools_ok else ())
        while True:
            m = yield from scan_content(ctx, markers)
            if m is None:
                return
            if m != OPEN:
                ctx.pos += len(m)
                ctx.held_ws = ""
                continue

            def block() -> Gen:
                yield from literal(ctx, OPEN)
                return (yield from parse_json_array_of_calls(ctx, lambda: json_call_object(ctx)))

            yield from try_block(ctx, block(), on_fail_content=OPEN)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        obj = g.add("call-obj", alt([g.add(f"obj-{i}", json_call_body(n, a)) for i, (n, a) in enumerate(rules)]))
        body = f'{lit(OPEN)} "[" {SP} {repeat_calls(obj, parallel, COMMA)} {SP} "]"'
        return f"{body} {SP}" if lazy else f"{SP} {body} {SP}"
