"""Liquid LFM2 / LFM2.5: Python-style calls in a list,

    <|tool_call_start|>[get_weather(city='Paris', days=3), run_shell(cmd="ls")]<|tool_call_end|>

The list is read with Python's parser (``ast``; nothing is evaluated) and only literal keyword
arguments are accepted. The arguments JSON is emitted once the list is complete.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from ._base import Ctx, Gen, blocks_in_content, emit_call, literal, read_until
from ._format import ToolFormat, ToolRule
from ._grammar import COMMA, SP, GrammarBuilder, alt, lit, regex_escape, repeat_calls

OPEN, CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
MAX_CALL_TEXT = 1_000_000


def parse_pythonic_calls(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """``[f(a=1), g(b="x")]`` → [("f", {"a": 1}), ...]; None when it is anything else."""
    if len(text) > MAX_CALL_TEXT:
        return None
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    items = node.elts if isinstance(node, ast.List) else [node]
    out = []
    for item in items:
        if not (isinstance(item, ast.Call) and not item.args):
            return None
        f = item.func
        if isinstance(f, ast.Name):
            name = f.id
        elif isinstance(f, ast.Attribute):  # dotted names, e.g. module.tool
            parts = []
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if not isinstance(f, ast.Name):
                return None
            name = ".".join([f.id] + parts[::-1])
        else:
            return None
        args: dict[str, Any] = {}
        for kw in item.keywords:
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
        out.append((name, args))
    return out


class Lfm2Format(ToolFormat):
    name = "lfm2"
    triggers = (regex_escape(OPEN),)

    def run(self, ctx: Ctx) -> Gen:
        def block(opener: str) -> Gen:
            yield from literal(ctx, OPEN)
            got = yield from read_until(ctx, (CLOSE,))
            if got is None or got[1] is None:
                return False
            calls = parse_pythonic_calls(got[0])
            if not calls or not all(ctx.info.accepts(n) for n, _ in calls):
                return False
            for name, args in calls:
                yield from emit_call(ctx, name, json.dumps(args, ensure_ascii=False))
            return True

        yield from blocks_in_content(ctx, (OPEN,), block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        # Python keyword arguments: JSON values are valid Python literals except true/false/null,
        # so the values are constrained loosely here (any text without the closing marker).
        g.add("py-key", "[a-zA-Z_] [a-zA-Z0-9_]{0,63}")
        g.add("py-str", r'''"'" ([^'\\\n] | "\\" [^\n])* "'" | "\"" ([^"\\\n] | "\\" [^\n])* "\""''')
        g.add(
            "py-atom",
            'py-str | [-+0-9.eE]{1,32} | "True" | "False" | "None" | '
            '"[" (py-atom (", " py-atom)*)? "]" | '
            '"{" (py-str ": " py-atom (", " py-atom)*)? "}"',
        )
        g.add("py-kwargs", '(py-key "=" py-atom (", " py-key "=" py-atom)*)?')
        calls_ = [g.add(f"call-{i}", f'{lit(n + "(")} py-kwargs ")"') for i, (n, _) in enumerate(rules)]
        inner = repeat_calls(g.add("call", alt(calls_)), parallel, COMMA)
        body = f'{lit(OPEN)} "[" {inner} "]" {lit(CLOSE)}'
        return f"{body} {SP}" if lazy else f"{SP} {body} {SP}"
