"""Gemma 4: ``<|tool_call>call:NAME{key:value,…}<tool_call|>``, values in Gemma's own notation:
strings between ``<|"|>`` quotes, bare keys, numbers, ``true``/``false``, ``[…]``, ``{…}``.
Converted to JSON with a linear scan; the arguments JSON is emitted once the call is complete.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ._base import Ctx, Gen, blocks_in_content, emit_call, literal, read_until
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, lit, regex_escape, repeat_calls

OPEN, CLOSE, QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_BARE = re.compile(r"[A-Za-z0-9_.+\-]+")


def gemma_to_json(text: str) -> Any:
    """Gemma's argument notation → a Python value; ValueError when malformed."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text.startswith(QUOTE, i):
            j = text.find(QUOTE, i + len(QUOTE))
            if j < 0:
                raise ValueError("unterminated string")
            out.append(json.dumps(text[i + len(QUOTE) : j], ensure_ascii=False))
            i = j + len(QUOTE)
            continue
        c = text[i]
        if c in "{}[],:":
            out.append(c)
            i += 1
        elif c in " \t\r\n":
            i += 1
        else:
            m = _BARE.match(text, i)
            if not m:
                raise ValueError(f"unexpected {c!r}")
            word = m.group()
            i = m.end()
            k = i
            while k < n and text[k] in " \t":
                k += 1
            if k < n and text[k] == ":":
                out.append(json.dumps(word))  # a bare key
            elif word in ("true", "false", "null"):
                out.append(word)
            elif word == "None":
                out.append("null")
            else:
                try:
                    float(word)
                except ValueError:
                    raise ValueError(f"unexpected {word!r}") from None
                out.append(word)
    return json.loads("".join(out))


class Gemma4Format(ToolFormat):
    name = "gemma4"
    triggers = (regex_escape(OPEN),)

    def run(self, ctx: Ctx) -> Gen:
        def block(opener: str) -> Gen:
            yield from literal(ctx, OPEN)
            if not (yield from literal(ctx, "call:")):
                return False
            got = yield from read_until(ctx, ("{",), limit=256)
            if got is None or got[1] is None or not ctx.info.accepts(got[0].strip()):
                return False
            name = got[0].strip()
            body = yield from read_until(ctx, (CLOSE,))
            if body is None or body[1] is None:
                return False
            try:
                args = gemma_to_json("{" + body[0])
            except (ValueError, RecursionError):
                return False
            if not isinstance(args, dict):
                return False
            yield from emit_call(ctx, name, json.dumps(args, ensure_ascii=False))
            return True

        yield from blocks_in_content(ctx, (OPEN,), block)

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        # Loose: any well-formed Gemma-notation object (the schema is not applied).
        g.add("gm-str", f"{lit(QUOTE)} {g.not_containing(QUOTE, 'gm')} {lit(QUOTE)}")
        g.add("gm-key", "[a-zA-Z_] [a-zA-Z0-9_]{0,63}")
        g.add(
            "gm-val",
            'gm-str | "-"? [0-9]{1,16} ("." [0-9]{1,16})? | "true" | "false" | "null" | '
            '"[" (gm-val ("," gm-val)*)? "]" | gm-obj',
        )
        g.add("gm-obj", '"{" (gm-key ":" gm-val ("," gm-key ":" gm-val)*)? "}"')
        calls_ = [
            g.add(f"call-{i}", f"{lit(OPEN + 'call:' + n)} gm-obj {lit(CLOSE)}") for i, (n, _) in enumerate(rules)
        ]
        calls = repeat_calls(g.add("call", alt(calls_)), parallel)
        return f"{calls} {SP}" if lazy else f"{SP} {calls} {SP}"
