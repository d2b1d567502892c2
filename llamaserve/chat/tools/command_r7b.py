"""Cohere Command R7B (and Command A / Cohere2 MoE):

    <|START_THINKING|>I should look it up.<|END_THINKING|><|START_ACTION|>[
        {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}
    ]<|END_ACTION|>

or ``<|START_RESPONSE|>answer<|END_RESPONSE|>``. Thinking becomes reasoning, the response
content, plain text outside the tags content too. Templates whose generation prompt already
opens ``<|START_THINKING|>`` (Cohere2 MoE) pass ``reasoning_open=True``. The model's
``tool_call_id`` values ("0", "1", ...) are not unique across turns and are not reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llamaserve.chat.parsed import ReasoningDelta

from ._base import (
    Ctx,
    Gen,
    json_call_object,
    literal,
    parse_json_array_of_calls,
    scan_content,
    skip_ws,
    try_block,
)
from ._format import ToolFormat, ToolRule
from ._grammar import COMMA, SP, GrammarBuilder, alt, json_call_body, lit, regex_escape, repeat_calls

THINK_OPEN, THINK_CLOSE = "<|START_THINKING|>", "<|END_THINKING|>"
ACTION_OPEN, ACTION_CLOSE = "<|START_ACTION|>", "<|END_ACTION|>"
RESP_OPEN, RESP_CLOSE = "<|START_RESPONSE|>", "<|END_RESPONSE|>"


def _call(ctx: Ctx) -> Gen:
    return json_call_object(ctx, name_keys=("tool_name",), args_keys=("parameters",), id_keys=())


class CommandR7BFormat(ToolFormat):
    name = "command_r7b"
    handles_reasoning = True
    reasoning_markers = ((THINK_OPEN, THINK_CLOSE),)
    triggers = (regex_escape(ACTION_OPEN),)

    def run(self, ctx: Ctx) -> Gen:
        if ctx.reasoning_open:
            yield from literal(ctx, THINK_OPEN)
            if (yield from scan_content(ctx, (THINK_CLOSE,), ReasoningDelta)) is None:
                return
            ctx.pos += len(THINK_CLOSE)
            ctx.held_ws = ""
            ctx.after_block = True
        markers = (THINK_OPEN, RESP_OPEN, RESP_CLOSE) + ((ACTION_OPEN,) if ctx.tools_ok else ())
        while True:
            m = yield from scan_content(ctx, markers)
            if m is None:
                return
            if m == ACTION_OPEN:

                def block() -> Gen:
                    yield from literal(ctx, ACTION_OPEN)
                    if not (yield from parse_json_array_of_calls(ctx, lambda: _call(ctx))):
                        return False
                    yield from skip_ws(ctx)
                    yield from literal(ctx, ACTION_CLOSE)  # tolerated when missing
                    return True

                yield from try_block(ctx, block(), on_fail_content=m)
                continue
            ctx.pos += len(m)
            ctx.held_ws = ""
            if m == THINK_OPEN:
                if (yield from scan_content(ctx, (THINK_CLOSE,), ReasoningDelta)) is None:
                    return
                ctx.pos += len(THINK_CLOSE)
                ctx.held_ws = ""
                ctx.after_block = True
            elif m == RESP_CLOSE:
                ctx.after_block = True

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        g.add("call-id", '"\\"" [0-9]{1,3} "\\""')
        objs = []
        for i, (n, a) in enumerate(rules):
            body = json_call_body(n, a, name_key="tool_name", args_key="parameters")
            body = body.replace('"{" ', f'"{{" {SP} "\\"tool_call_id\\"" {SP} ":" {SP} call-id {SP} "," ', 1)
            objs.append(g.add(f"obj-{i}", body))
        obj = g.add("call-obj", alt(objs))
        body = f'{lit(ACTION_OPEN)} "[" {SP} {repeat_calls(obj, parallel, COMMA)} {SP} "]" {lit(ACTION_CLOSE)}'
        if lazy:
            return f"{body} {SP}"
        think = g.not_containing(THINK_CLOSE, "think")
        return f"{SP} ({lit(THINK_OPEN)} {think} {lit(THINK_CLOSE)})? {body} {SP}"
