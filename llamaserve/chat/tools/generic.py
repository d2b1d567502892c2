"""The fallback for templates without native tool support (llama-server's "Generic" format).

The model is asked (see :meth:`GenericFormat.system_prompt`) and constrained (a grammar that
applies from the first token, also in ``auto`` mode) to answer with one JSON object:

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    {"response": "It is sunny."}

``response`` is streamed as content as it is decoded. Anything that is not such an object is
content as it stands.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llamaserve.chat.parsed import ContentDelta, GrammarSpec

from ._base import (
    NEED,
    Ctx,
    Gen,
    content_only,
    json_call_object,
    json_string,
    json_value,
    literal,
    parse_json_array_of_calls,
    rest_as,
    skip_ws,
    try_block,
    wait,
)
from ._format import ToolChoiceError, ToolFormat, ToolRule, normalize_tool_choice
from ._grammar import COMMA, SP, SP_RULE, GrammarBuilder, alt, json_call_body, repeat_calls
from ._jsonscan import _STR_STOP
from ._toolinfo import tool_function, tool_name, tool_parameters


def _stream_string(ctx: Ctx) -> Gen:
    """A JSON string at ``pos``, streamed as decoded ContentDelta text. True when complete."""
    if not (yield from literal(ctx, '"')):
        return False
    while True:
        m = _STR_STOP.search(ctx.buf, ctx.pos)
        end = m.start() if m else len(ctx.buf)
        if end > ctx.pos:
            yield ContentDelta(ctx.buf[ctx.pos : end])
            ctx.pos = end
        if m is None:
            if ctx.final:
                return False
            yield NEED
            continue
        c = ctx.buf[end]
        if c == '"':
            ctx.pos += 1
            return True
        if c != "\\":  # a raw control character (a real newline): lenient, it is text
            ctx.pos += 1
            yield ContentDelta(c)
            continue
        if not (yield from wait(ctx, 2)):
            return False
        n = 2
        if ctx.buf[ctx.pos + 1] == "u":
            n = 6
            if not (yield from wait(ctx, 6)):
                return False
            high_surrogate = ctx.buf[ctx.pos + 2 : ctx.pos + 4].lower() in ("d8", "d9", "da", "db")
            if high_surrogate and (yield from wait(ctx, 12)) and ctx.buf[ctx.pos + 6 : ctx.pos + 8] == "\\u":
                n = 12
        try:
            text = json.loads('"' + ctx.buf[ctx.pos : ctx.pos + n] + '"')
        except ValueError:
            return False
        ctx.pos += n
        yield ContentDelta(text)


def _object(ctx: Ctx) -> Gen:
    yield from skip_ws(ctx)
    if not (yield from literal(ctx, "{")):
        return False
    useful = False
    first = True
    while True:
        yield from skip_ws(ctx)
        if (yield from literal(ctx, "}")):
            return useful
        if not first and not (yield from literal(ctx, ",")):
            return False
        first = False
        key = yield from json_string(ctx)
        yield from skip_ws(ctx)
        if not isinstance(key, str) or not (yield from literal(ctx, ":")):
            return False
        yield from skip_ws(ctx)
        if key == "tool_calls" and ctx.tools_ok:
            if not (yield from parse_json_array_of_calls(ctx, lambda: json_call_object(ctx))):
                return False
            useful = True
        elif key == "tool_call" and ctx.tools_ok:
            if not (yield from json_call_object(ctx)):
                return False
            useful = True
        elif key == "response":
            if not (yield from wait(ctx)):
                return False
            if ctx.buf[ctx.pos] == '"':
                if not (yield from _stream_string(ctx)):
                    return False
            else:
                text = yield from json_value(ctx)
                if text is None:
                    return False
                yield ContentDelta(text)
            useful = True
        else:
            if (yield from json_value(ctx)) is None:
                return False


class GenericFormat(ToolFormat):
    name = "generic"

    def run(self, ctx: Ctx) -> Gen:
        if not ctx.tools_ok:
            yield from content_only(ctx)
            return
        if (yield from try_block(ctx, _object(ctx))):
            yield from skip_ws(ctx)
        yield from rest_as(ctx)

    def system_prompt(
        self, tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any = "auto", parallel: bool = True
    ) -> str | None:
        """The instructions llama-server adds for this format (the template knows no tools)."""
        mode, wanted = normalize_tool_choice(tool_choice)
        tools = [t for t in (tools or []) if isinstance(t, Mapping) and tool_name(t)]
        if mode == "none" or not tools:
            return None
        if mode == "named":
            tools = [t for t in tools if tool_name(t) == wanted]
        described = [
            {
                "name": tool_name(t),
                "description": tool_function(t).get("description", ""),
                "parameters": tool_parameters(t),
            }
            for t in tools
        ]
        key = (
            '"tool_calls": [{"name": ..., "arguments": {...}}, ...]'
            if parallel
            else '"tool_calls": [{"name": ..., "arguments": {...}}] (one call)'
        )
        how = f"a JSON object {{{key}}} to call tools"
        if mode == "auto":
            how += ', or {"response": "..."} to reply to the user directly'
        return (
            "You can call these tools:\n"
            + json.dumps(described, ensure_ascii=False, indent=2)
            + f"\n\nRespond with {how}."
        )

    def grammar(
        self, tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any = "auto", parallel: bool = True, **_: Any
    ) -> GrammarSpec | None:
        """Non-lazy in every mode (the whole reply is the JSON object)."""
        mode, wanted = normalize_tool_choice(tool_choice)
        tools = [t for t in (tools or []) if isinstance(t, Mapping) and tool_name(t)]
        if mode == "none" or not tools:
            if mode == "named":
                raise ToolChoiceError(f"tool_choice names {wanted!r} but no tools were given")
            return None
        if mode == "named":
            tools = [t for t in tools if tool_name(t) == wanted][:1]
            if not tools:
                raise ToolChoiceError(f"tool_choice names {wanted!r}, which is not among the tools")
        g = GrammarBuilder()
        g.add(SP, SP_RULE)
        rules: list[ToolRule] = [
            (tool_name(t), g.schema(tool_parameters(t), f"t{i}", tool=tool_name(t))) for i, t in enumerate(tools)
        ]
        obj = g.add("call-obj", alt([g.add(f"obj-{i}", json_call_body(n, a)) for i, (n, a) in enumerate(rules)]))
        calls = f'"\\"tool_calls\\"" {SP} ":" {SP} "[" {SP} {repeat_calls(obj, parallel, COMMA)} {SP} "]"'
        if mode == "auto":
            s = g.schema({"type": "string"}, "resp")
            calls = f'({calls} | "\\"response\\"" {SP} ":" {SP} {s})'
        return GrammarSpec(g.text(f'{SP} "{{" {SP} {calls} {SP} "}}" {SP}'))

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        raise NotImplementedError  # grammar() is overridden
