"""FireFunction v2 (fireworks-ai llama-3-firefunction-v2): `` functools[{"name": ...,
"arguments": {...}}, ...]`` after optional content."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._base import Ctx, Gen, blocks_in_content, json_call_object, literal, parse_json_array_of_calls
from ._format import ToolFormat, ToolRule
from ._grammar import COMMA, SP, GrammarBuilder, alt, json_call_body, repeat_calls

OPEN = "functools"


class FirefunctionV2Format(ToolFormat):
    name = "firefunction_v2"
    triggers = (r"functools\[",)

    def run(self, ctx: Ctx) -> Gen:
        def block(opener: str) -> Gen:
            yield from literal(ctx, OPEN)
            return (yield from parse_json_array_of_calls(ctx, lambda: json_call_object(ctx)))

        yield from blocks_in_content(ctx, (OPEN + "[",), block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        obj = g.add("call-obj", alt([g.add(f"obj-{i}", json_call_body(n, a)) for i, (n, a) in enumerate(rules)]))
        body = f'"functools[" {SP} {repeat_calls(obj, parallel, COMMA)} {SP} "]"'
        return f"{body} {SP}" if lazy else f'{SP} " "? {body} {SP}'
