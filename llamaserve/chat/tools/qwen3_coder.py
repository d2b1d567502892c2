"""Qwen3-Coder / Qwen3.5 / Nemotron 3 / Step 3.5 XML calls (and ByteDance Seed-OSS, the same
syntax in ``<seed:tool_call>`` tags):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Values are raw text (one newline on each side is formatting); a parameter declared as a string
stays text, others are read as JSON when they parse. The arguments JSON is emitted once the
call is complete. A call cut off before ``</function>`` stays content.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ._base import Ctx, Gen, blocks_in_content, emit_call, literal, one_of, read_until, skip_ws
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, lit, regex_escape, repeat_calls, xml_params, xml_params_body
from ._toolinfo import dump_args, typed_value

_NAME_BAD = re.compile(r"[\s<>]")


def _strip_nl(v: str) -> str:
    if v.startswith("\r\n"):
        v = v[2:]
    elif v.startswith("\n"):
        v = v[1:]
    if v.endswith("\r\n"):
        v = v[:-2]
    elif v.endswith("\n"):
        v = v[:-1]
    return v


class Qwen3CoderFormat(ToolFormat):
    name = "qwen3_coder"

    def __init__(
        self,
        name: str = "qwen3_coder",
        open_tag: str = "<tool_call>",
        close_tag: str = "</tool_call>",
        newlines: bool = True,
    ) -> None:
        self.name = name
        self.open_tag = open_tag
        self.close_tag = close_tag
        self.newlines = newlines  # values are written on their own lines
        self.triggers = (regex_escape(open_tag), regex_escape("<function="))

    def run(self, ctx: Ctx) -> Gen:
        def block(opener: str) -> Gen:
            wrapped = opener == self.open_tag
            yield from literal(ctx, opener)
            if wrapped:
                yield from skip_ws(ctx)
                if not (yield from literal(ctx, "<function=")):
                    return False
            got = yield from read_until(ctx, (">",), limit=256, charset=_NAME_BAD)
            if got is None or got[1] is None or not ctx.info.accepts(got[0].strip()):
                return False
            name = got[0].strip()
            args: dict[str, Any] = {}
            while True:
                yield from skip_ws(ctx)
                tag = yield from one_of(ctx, ("<parameter=", "</function>"))
                if tag is None:
                    return False
                if tag == "</function>":
                    break
                got = yield from read_until(ctx, (">",), limit=256, charset=_NAME_BAD)
                if got is None or got[1] is None:
                    return False
                key = got[0].strip()
                val = yield from read_until(ctx, ("</parameter>",))
                if val is None or val[1] is None:
                    return False
                args[key] = typed_value(ctx.info, name, key, _strip_nl(val[0]))
            if wrapped:
                yield from skip_ws(ctx)
                yield from literal(ctx, self.close_tag)  # tolerated when missing
            yield from emit_call(ctx, name, dump_args(args))
            return True

        yield from blocks_in_content(ctx, (self.open_tag, "<function="), block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        nl = lit("\n") if self.newlines else '""'
        close_p = g.not_containing("</parameter>", "xv")

        def one(key: str, value: str | None) -> str:
            v = close_p if value is None else value
            return f'"<parameter=" {key} ">" {nl} {v} {nl} "</parameter>" {SP}'.replace('"" ', "")

        funcs = []
        for i, t in enumerate(tools):
            params, extra = xml_params(g, t.get("function", t).get("parameters"), f"f{i}")
            body = xml_params_body(g, params, extra, f"f{i}", one)
            funcs.append(g.add(f"func-{i}", f'"<function={rules[i][0]}>" {SP} {body} "</function>"'))
        call = g.add("call", f"{lit(self.open_tag)} {SP} {alt(funcs)} {SP} {lit(self.close_tag)}")
        calls = repeat_calls(call, parallel, SP)
        if lazy:
            # a trigger may also have matched a bare <function= (no wrapper)
            return f"({calls} | {alt(funcs)}) {SP}"
        return f"{SP} {calls} {SP}"
