"""Hermes / Qwen 2.5 / Qwen 3 (and the many ChatML models trained on it):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Content may come before the calls; several blocks are parallel calls. Qwen2.5-Coder sometimes
drops the tags: a message that is *exactly* one JSON object ``{"name": <an offered tool>,
"arguments": {...}}`` (whitespace around it, or a Markdown ```json fence, allowed) is accepted
as a call too. Since that can only be decided at the end of the message, such a message is held
back until then (only when it starts with ``{"name"``, so ordinary text streams at once).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._base import (
    Ctx,
    Gen,
    blocks_in_content,
    emit_call,
    json_call_object,
    json_value,
    literal,
    one_of,
    skip_ws,
    try_block,
)
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, json_call_body, lit, repeat_calls

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def bare_json_call(ctx: Ctx) -> Gen:
    """The whole rest of the message is one ``{"name": ..., "arguments": {...}}`` object
    (possibly in a Markdown ```json fence)."""
    yield from skip_ws(ctx)
    fenced = (yield from one_of(ctx, ("```json", "```"))) is not None
    yield from skip_ws(ctx)
    start = ctx.pos
    if not (yield from literal(ctx, "{")):
        return False
    yield from skip_ws(ctx)
    if not (yield from literal(ctx, '"name"')):
        return False
    ctx.pos = start
    text = yield from json_value(ctx)
    if text is None:
        return False
    yield from skip_ws(ctx)
    if fenced:
        if not (yield from literal(ctx, "```")):
            return False
        yield from skip_ws(ctx)
    if not ctx.at_eof():
        return False
    obj = json.loads(text)
    name = obj.get("name")
    if not isinstance(name, str) or not ctx.info.accepts(name):
        return False
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return False
    if not isinstance(args, dict) or not set(obj) <= {"name", "arguments", "parameters", "id"}:
        return False
    yield from emit_call(ctx, name, json.dumps(args, ensure_ascii=False))
    return True


class HermesFormat(ToolFormat):
    name = "hermes"
    triggers = ("<tool_call>", r'^\s*(\{\s*"name"\s*:)')

    def __init__(self, bare_json: bool = True) -> None:
        self.bare_json = bare_json

    def run(self, ctx: Ctx) -> Gen:
        if ctx.tools_ok and self.bare_json and (yield from try_block(ctx, bare_json_call(ctx))):
            return

        def block(opener: str) -> Gen:
            yield from literal(ctx, opener)
            if not (yield from json_call_object(ctx)):
                return False
            yield from skip_ws(ctx)
            yield from literal(ctx, CLOSE)  # tolerated when missing
            return True

        yield from blocks_in_content(ctx, (OPEN,), block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        objs = []
        for i, (name, args) in enumerate(rules):
            objs.append(g.add(f"obj-{i}", json_call_body(name, args)))
        obj = g.add("call-obj", alt(objs))
        call = g.add("call", f"{lit(OPEN)} {SP} call-obj {SP} {lit(CLOSE)}")
        calls = repeat_calls(call, parallel, SP)
        if lazy:
            # a trigger matched either the tag or the start of a bare JSON call
            return f"({calls} | {obj}) {SP}"
        return f"{SP} {calls} {SP}"
