"""JSON calls inside a pair of marker tags, for several families:

- ``apriel`` (ServiceNow Apriel 1.5 / 1.6): ``<tool_calls>[{"name": …, "arguments": {…}}, …]</tool_calls>``
- ``nemotron_v2`` (NVIDIA Nemotron Nano v2): ``<TOOLCALL>[…]</TOOLCALL>``
- ``minimax_m1`` (MiniMax M1): ``<tool_calls>`` then one JSON object per line, ``</tool_calls>``
- ``gigachat`` (GigaChat 3 / 3.1): ``<|function_call|>{"name": …, "arguments": {…}}`` (3.1) or a
  ``function call<|role_sep|>`` turn holding the object (3)
- ``apertus`` (Swiss AI Apertus): ``<|tools_prefix|>[{"NAME": {…arguments…}}, …]<|tools_suffix|>``

Arguments are streamed as they arrive (when the name comes first).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._base import (
    Ctx,
    Gen,
    blocks_in_content,
    json_call_object,
    json_string,
    json_value,
    literal,
    parse_json_array_of_calls,
    skip_ws,
    wait,
)
from ._format import ToolFormat, ToolRule
from ._grammar import COMMA, SP, GrammarBuilder, alt, json_call_body, json_str_lit, lit, regex_escape, repeat_calls

ARRAY, LINES, SINGLE, NAMED = "array", "lines", "single", "named"


def _named_call(ctx: Ctx) -> Gen:
    """``{"NAME": {arguments}}``."""
    yield from skip_ws(ctx)
    if not (yield from literal(ctx, "{")):
        return False
    name = yield from json_string(ctx)
    if not isinstance(name, str) or not ctx.info.accepts(name):
        return False
    yield from skip_ws(ctx)
    if not (yield from literal(ctx, ":")):
        return False
    yield from skip_ws(ctx)
    if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != "{":
        return False
    yield ctx.start_call(name)
    if (yield from json_value(ctx, emit_index=ctx.index - 1)) is None:
        return False
    yield from skip_ws(ctx)
    return (yield from literal(ctx, "}"))


class JsonBlockFormat(ToolFormat):
    def __init__(self, name: str, openers: tuple[str, ...], close: str, shape: str) -> None:
        self.name = name
        self.openers = openers
        self.close = close
        self.shape = shape
        self.triggers = tuple(regex_escape(o) for o in openers)

    def run(self, ctx: Ctx) -> Gen:
        def block(opener: str) -> Gen:
            yield from literal(ctx, opener)
            shape = self.shape
            if shape in (ARRAY, LINES):  # accept either (the models mix them up)
                yield from skip_ws(ctx)
                if not (yield from wait(ctx)):
                    return False
                shape = ARRAY if ctx.buf[ctx.pos] == "[" else LINES
            if shape == ARRAY:
                ok = yield from parse_json_array_of_calls(ctx, lambda: json_call_object(ctx))
            elif shape == NAMED:
                ok = yield from parse_json_array_of_calls(ctx, lambda: _named_call(ctx))
            elif shape == SINGLE:
                ok = yield from json_call_object(ctx)
            else:
                ok = False
                while True:
                    yield from skip_ws(ctx)
                    if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != "{":
                        break
                    if not (yield from json_call_object(ctx)):
                        return False
                    ok = True
            if not ok:
                return False
            yield from skip_ws(ctx)
            if self.close:
                yield from literal(ctx, self.close)  # tolerated when missing
            return True

        yield from blocks_in_content(ctx, self.openers, block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        if self.shape == NAMED:
            objs = [
                g.add(f"obj-{i}", f'"{{" {SP} {json_str_lit(n)} {SP} ":" {SP} {a} {SP} "}}"')
                for i, (n, a) in enumerate(rules)
            ]
        else:
            objs = [g.add(f"obj-{i}", json_call_body(n, a)) for i, (n, a) in enumerate(rules)]
        obj = g.add("call-obj", alt(objs))
        if self.shape in (ARRAY, NAMED):
            inner = f'"[" {SP} {repeat_calls(obj, parallel, COMMA)} {SP} "]"'
        elif self.shape == LINES:
            inner = f'"\\n" {repeat_calls(obj, parallel, chr(34) + chr(92) + "n" + chr(34))} "\\n"'
        else:
            inner = obj
        close = lit(self.close) if self.close else ""
        body = f"{lit(self.openers[0])} {inner} {close}"
        return f"{body} {SP}" if lazy else f"{SP} {body} {SP}"


APRIEL = JsonBlockFormat("apriel", ("<tool_calls>",), "</tool_calls>", ARRAY)
NEMOTRON_V2 = JsonBlockFormat("nemotron_v2", ("<TOOLCALL>",), "</TOOLCALL>", ARRAY)
MINIMAX_M1 = JsonBlockFormat("minimax_m1", ("<tool_calls>",), "</tool_calls>", LINES)
GIGACHAT = JsonBlockFormat(
    "gigachat",
    ("<|function_call|>", "<|message_sep|>\n\nfunction call<|role_sep|>", "function call<|role_sep|>"),
    "",
    SINGLE,
)
APERTUS = JsonBlockFormat("apertus", ("<|tools_prefix|>",), "<|tools_suffix|>", NAMED)
