"""Llama 3.1 / 3.2 / 3.3: custom tools are a JSON object at the start of the message,

    {"name": "get_weather", "parameters": {"city": "Paris"}}

(``"arguments"`` and a leading ``"type": "function"`` are accepted too; Llama 3.2 may chain
several with ``;``). Built-in tools use ``<|python_tag|>``: ``brave_search.call(query="...")``
becomes a call to that tool with keyword arguments, raw code a call to ``python`` /
``code_interpreter`` with ``{"code": ...}`` (when such a tool was offered), a JSON call object a
call. JSON elsewhere in the text is content.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from ._base import (
    Ctx,
    Gen,
    blocks_in_content,
    emit_call,
    json_call_object,
    literal,
    read_until,
    skip_ws,
    try_block,
    wait,
)
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, json_call_body, repeat_calls

PYTHON_TAG = "<|python_tag|>"
_END = ("<|eom_id|>", "<|eot_id|>")


def _type_ok(key: str, value: Any) -> bool:
    return key != "type" or value == "function"


def _call(ctx: Ctx) -> Gen:
    return json_call_object(ctx, args_keys=("parameters", "arguments"), extra_check=_type_ok, allow_missing_args=False)


def _builtin_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """``tool.call(k=v, ...)`` with literal values, parsed without evaluating anything."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "call"
        and isinstance(node.func.value, ast.Name)
        and not node.args
    ):
        return None
    args: dict[str, Any] = {}
    for kw in node.keywords:
        if kw.arg is None:
            return None
        try:
            args[kw.arg] = ast.literal_eval(kw.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
    try:
        json.dumps(args)
    except (TypeError, ValueError):
        return None
    return node.func.value.id, args


class Llama3Format(ToolFormat):
    name = "llama3"
    triggers = (r'^\s*(\{\s*(?:"type"\s*:\s*"function"\s*,\s*)?"name"\s*:)',)

    def run(self, ctx: Ctx) -> Gen:
        if ctx.tools_ok:

            def first() -> Gen:
                yield from skip_ws(ctx)
                if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != "{":
                    return False
                return (yield from _call(ctx))

            def more() -> Gen:
                yield from skip_ws(ctx)
                if not (yield from literal(ctx, ";")):
                    return False
                yield from skip_ws(ctx)
                if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != "{":
                    return False
                return (yield from _call(ctx))

            if (yield from try_block(ctx, first())):
                while (yield from try_block(ctx, more())):
                    pass

        def python_block(opener: str) -> Gen:
            yield from literal(ctx, PYTHON_TAG)
            yield from skip_ws(ctx)
            if (yield from wait(ctx)) and ctx.buf[ctx.pos] == "{":
                if (yield from _call(ctx)):
                    yield from skip_ws(ctx)
                    yield from literal(ctx, "<|eom_id|>")
                    return True
                return False
            got = yield from read_until(ctx, _END)
            if got is None:
                return False
            code = got[0]
            builtin = _builtin_call(code)
            if builtin is not None and ctx.info.accepts(builtin[0]):
                yield from emit_call(ctx, builtin[0], json.dumps(builtin[1], ensure_ascii=False))
                return True
            for name in ("python", "code_interpreter"):
                if ctx.info.accepts(name) and (ctx.info.names is not None or name == "python"):
                    yield from emit_call(ctx, name, json.dumps({"code": code}, ensure_ascii=False))
                    return True
            return False

        yield from blocks_in_content(ctx, (PYTHON_TAG,), python_block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        typ = f'("\\"type\\"" {SP} ":" {SP} "\\"function\\"" {SP} "," {SP})?'
        objs = []
        for i, (n, a) in enumerate(rules):
            body = json_call_body(n, a, args_key="parameters")
            objs.append(g.add(f"obj-{i}", body.replace('"{" ', f'"{{" {SP} {typ} ', 1)))
        call = g.add("call", alt(objs))
        calls = repeat_calls(call, parallel, f'{SP} ";"')
        return f"{calls} {SP}" if lazy else f"{SP} {calls} {SP}"
