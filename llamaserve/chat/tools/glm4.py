"""GLM 4.5 / 4.6 / 4.7 key-value calls (also Ling 3, Laguna, Spark 2.5, and Tencent Hy3 with
its ``:opensource`` tag spelling):

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

Values are raw text: a parameter declared as a string stays text, others are read as JSON when
they parse. The arguments JSON is emitted once the call is complete; a call cut off before its
closing tag stays content.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._base import Ctx, Gen, blocks_in_content, emit_call, literal, one_of, read_until, skip_ws
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, lit, regex_escape, repeat_calls, xml_params, xml_params_body
from ._toolinfo import dump_args, typed_value

_NAME_BAD = re.compile(r"[<>]")


@dataclass(frozen=True)
class Glm4Tags:
    call_open: str = "<tool_call>"
    call_close: str = "</tool_call>"
    key_open: str = "<arg_key>"
    key_close: str = "</arg_key>"
    value_open: str = "<arg_value>"
    value_close: str = "</arg_value>"
    name_sep: str = ""  # written after the name (Hy3: <tool_sep:opensource>)
    section_open: str = ""  # a wrapper around all calls (Hy3: <tool_calls:opensource>)
    section_close: str = ""


HY3_TAGS = Glm4Tags(
    "<tool_call:opensource>",
    "</tool_call:opensource>",
    "<arg_key:opensource>",
    "</arg_key:opensource>",
    "<arg_value:opensource>",
    "</arg_value:opensource>",
    "<tool_sep:opensource>",
    "<tool_calls:opensource>",
    "</tool_calls:opensource>",
)


class Glm4Format(ToolFormat):
    name = "glm4"

    def __init__(self, name: str = "glm4", tags: Glm4Tags = Glm4Tags()) -> None:
        self.name = name
        self.tags = tags
        self.triggers = (regex_escape(tags.section_open or tags.call_open),)

    def _call(self, ctx: Ctx) -> Gen:
        t = self.tags
        if not (yield from literal(ctx, t.call_open)):
            return False
        stops = tuple(s for s in ("\n", t.name_sep, t.key_open, t.call_close) if s)
        got = yield from read_until(ctx, stops, limit=256, charset=_NAME_BAD)
        if got is None or got[1] is None:
            return False
        name = got[0].strip()
        if got[1] in (t.key_open, t.call_close):
            ctx.pos -= len(got[1])
        if not ctx.info.accepts(name):
            return False
        args: dict[str, Any] = {}
        while True:
            yield from skip_ws(ctx)
            tag = yield from one_of(ctx, (t.key_open, t.call_close))
            if tag is None:
                return False
            if tag == t.call_close:
                break
            got = yield from read_until(ctx, (t.key_close,), limit=256)
            if got is None or got[1] is None:
                return False
            key = got[0].strip()
            yield from skip_ws(ctx)
            if not (yield from literal(ctx, t.value_open)):
                return False
            val = yield from read_until(ctx, (t.value_close,))
            if val is None or val[1] is None:
                return False
            args[key] = typed_value(ctx.info, name, key, val[0])
        yield from emit_call(ctx, name, dump_args(args))
        return True

    def run(self, ctx: Ctx) -> Gen:
        t = self.tags

        def block(opener: str) -> Gen:
            if opener == t.call_open:
                return (yield from self._call(ctx))
            yield from literal(ctx, opener)  # the section wrapper
            n = 0
            while True:
                yield from skip_ws(ctx)
                if (yield from literal(ctx, t.section_close)):
                    return n > 0
                if ctx.at_eof() and n:
                    return True
                if not (yield from self._call(ctx)):
                    return False
                n += 1

        openers = (t.section_open, t.call_open) if t.section_open else (t.call_open,)
        yield from blocks_in_content(ctx, openers, block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        t = self.tags
        text = g.not_containing(t.value_close, "gv")

        def one(key: str, value: str | None) -> str:
            return (
                f"{lit(t.key_open)} {key} {lit(t.key_close)} {SP} {lit(t.value_open)} "
                f"{text if value is None else value} {lit(t.value_close)} {SP}"
            )

        calls_ = []
        for i, tool in enumerate(tools):
            params, extra = xml_params(g, tool.get("function", tool).get("parameters"), f"f{i}")
            body = xml_params_body(g, params, extra, f"f{i}", one)
            sep = lit(t.name_sep) if t.name_sep else ""
            calls_.append(
                g.add(f"call-{i}", f"{lit(t.call_open)} {lit(rules[i][0])} {sep} {SP} {body} {lit(t.call_close)}")
            )
        call = g.add("call", alt(calls_))
        calls = repeat_calls(call, parallel, SP)
        if t.section_open:
            calls = f"{lit(t.section_open)} {SP} {calls} {SP} {lit(t.section_close)}"
        return f"{calls} {SP}" if lazy else f"{SP} {calls} {SP}"
