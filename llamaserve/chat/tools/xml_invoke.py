"""``<invoke name="…"><parameter name="…">value</parameter></invoke>`` calls, in the tag
spellings of several families:

- ``minimax_m2`` (MiniMax M2): ``<minimax:tool_call>`` wrapper, ``<invoke>``/``<parameter>``;
- ``deepseek_v3_2`` (DeepSeek V3.2, "DSML"): ``<｜DSML｜function_calls>`` wrapper,
  ``<｜DSML｜invoke name="…">``, ``<｜DSML｜parameter name="…" string="true|false">``;
- ``deepseek_v4`` (DeepSeek V4): the same with a ``<｜DSML｜tool_calls>`` wrapper;
- ``minicpm5`` (MiniCPM 5): ``<function name="…"><param name="…">value</param></function>``,
  no wrapper.

Values are raw text; ``string="false"`` (DSML) or a non-string declared type makes them JSON
when they parse. The arguments JSON is emitted once a call is complete; a call cut off before
its closing tag stays content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._base import Ctx, Gen, blocks_in_content, emit_call, literal, one_of, read_until, skip_ws
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, lit, regex_escape, repeat_calls, xml_params, xml_params_body
from ._toolinfo import dump_args, typed_value

_NAME_BAD = re.compile(r'[\s<>"]')


@dataclass(frozen=True)
class InvokeTags:
    section_open: str
    section_close: str
    invoke: str  # '<invoke name="'
    invoke_close: str  # '</invoke>'
    param: str  # '<parameter name="'
    param_close: str  # '</parameter>'
    string_attr: bool = False  # parameters carry string="true|false"


MINIMAX_M2 = InvokeTags(
    "<minimax:tool_call>", "</minimax:tool_call>", '<invoke name="', "</invoke>", '<parameter name="', "</parameter>"
)
DSML_V32 = InvokeTags(
    "<｜DSML｜function_calls>",
    "</｜DSML｜function_calls>",
    '<｜DSML｜invoke name="',
    "</｜DSML｜invoke>",
    '<｜DSML｜parameter name="',
    "</｜DSML｜parameter>",
    True,
)
DSML_V4 = InvokeTags(
    "<｜DSML｜tool_calls>",
    "</｜DSML｜tool_calls>",
    '<｜DSML｜invoke name="',
    "</｜DSML｜invoke>",
    '<｜DSML｜parameter name="',
    "</｜DSML｜parameter>",
    True,
)
MINICPM5 = InvokeTags("", "", '<function name="', "</function>", '<param name="', "</param>")


class XmlInvokeFormat(ToolFormat):
    def __init__(self, name: str, tags: InvokeTags) -> None:
        self.name = name
        self.tags = tags
        self.triggers = (regex_escape(tags.section_open or tags.invoke),)

    def _invoke(self, ctx: Ctx) -> Gen:
        """One call, after its ``invoke`` opener."""
        t = self.tags
        got = yield from read_until(ctx, ('"',), limit=256, charset=_NAME_BAD)
        if got is None or got[1] is None or not ctx.info.accepts(got[0]):
            return False
        name = got[0]
        if not (yield from literal(ctx, ">")):
            return False
        args: dict[str, Any] = {}
        while True:
            yield from skip_ws(ctx)
            tag = yield from one_of(ctx, (t.param, t.invoke_close))
            if tag is None:
                return False
            if tag == t.invoke_close:
                break
            got = yield from read_until(ctx, ('"',), limit=256)
            if got is None or got[1] is None:
                return False
            key = got[0]
            attrs = yield from read_until(ctx, (">",), limit=64)
            if attrs is None or attrs[1] is None:
                return False
            val = yield from read_until(ctx, (t.param_close,))
            if val is None or val[1] is None:
                return False
            if 'string="true"' in attrs[0]:
                args[key] = val[0]
            elif 'string="false"' in attrs[0]:
                try:
                    args[key] = json.loads(val[0])
                except ValueError:
                    args[key] = val[0]
            else:
                args[key] = typed_value(ctx.info, name, key, val[0])
        yield from emit_call(ctx, name, dump_args(args))
        return True

    def run(self, ctx: Ctx) -> Gen:
        t = self.tags

        def block(opener: str) -> Gen:
            yield from literal(ctx, opener)
            if opener == t.invoke:
                return (yield from self._invoke(ctx))
            n = 0
            while True:
                yield from skip_ws(ctx)
                if n and (yield from literal(ctx, t.section_close)):
                    return True
                if not (yield from literal(ctx, t.invoke)):
                    return n > 0  # the wrapper was not closed: what follows is content
                if not (yield from self._invoke(ctx)):
                    return False
                n += 1

        yield from blocks_in_content(ctx, (t.section_open or t.invoke,), block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        t = self.tags
        text = g.not_containing(t.param_close, "iv")

        def one(key: str, value: str | None) -> str:
            attr = ""
            if t.string_attr:
                attr = ' " string=\\"true\\""' if value is None else ' " string=\\"false\\""'
            return f'{lit(t.param)} {key} "\\""{attr} ">" {text if value is None else value} {lit(t.param_close)} {SP}'

        calls_ = []
        for i, tool in enumerate(tools):
            params, extra = xml_params(g, tool.get("function", tool).get("parameters"), f"f{i}")
            body = xml_params_body(g, params, extra, f"f{i}", one)
            calls_.append(
                g.add(f"call-{i}", f"{lit(t.invoke + rules[i][0] + chr(34) + '>')} {SP} {body} {lit(t.invoke_close)}")
            )
        calls = repeat_calls(g.add("call", alt(calls_)), parallel, SP)
        if t.section_open:
            calls = f"{lit(t.section_open)} {SP} {calls} {SP} {lit(t.section_close)}"
        return f"{calls} {SP}" if lazy else f"{SP} {calls} {SP}"
