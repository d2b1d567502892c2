"""gpt-oss (OpenAI harmony). The generation prompt ends with ``<|start|>assistant``; the model
then writes messages, each ``<|channel|>NAME[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY``
ended by ``<|end|>`` (then ``<|start|>assistant`` again), ``<|call|>`` or ``<|return|>``:

- ``analysis`` → reasoning;
- ``commentary`` with ``to=functions.NAME`` (the recipient may also stand in the role part,
  ``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>``) → a call whose
  body is the JSON arguments;
- ``final`` and commentary without a recipient (preambles) → content.

Text that is not in harmony form is content.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from llamaserve.chat.parsed import ContentDelta, ReasoningDelta

from ._base import (
    Ctx,
    Gen,
    json_value,
    one_of,
    read_until,
    rest_as,
    scan_content,
    skip_ws,
    try_block,
    wait,
)
from ._format import ToolFormat, ToolRule
from ._grammar import SP, GrammarBuilder, alt, lit

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
BODY_STOPS = ENDS + (START, CHANNEL)
_NEWLINE = re.compile(r"\n")


def _header(text: str) -> tuple[str, str] | None:
    """(channel, recipient) of a message header, or None if it is not one."""
    if text.startswith(START):
        text = text[len(START) :]
    if CHANNEL not in text:
        return None
    role, _, rest = text.partition(CHANNEL)
    if "<|" in role:
        return None
    recipient = ""
    words = role.split()
    if words and words[0] == "assistant":
        words = words[1:]
    for w in words:
        if w.startswith("to="):
            recipient = w[3:]
        elif w not in ("json",):
            return None
    rest = rest.replace("<|constrain|>", " ")
    parts = rest.split()
    if not parts:
        return None
    channel = parts[0]
    for w in parts[1:]:
        if w.startswith("to="):
            recipient = w[3:]
    return channel, recipient


class GptOssFormat(ToolFormat):
    name = "gpt_oss"
    handles_reasoning = True
    triggers = (r"(?:<\|channel\|>commentary)? to=functions\.",)

    def run(self, ctx: Ctx) -> Gen:
        while True:
            if ctx.after_block:
                yield from skip_ws(ctx)
            if ctx.at_eof():
                return
            start = ctx.pos
            got = None
            if (yield from one_of(ctx, (CHANNEL, START, " to=", "assistant"))) is not None:
                ctx.pos = start
                got = yield from read_until(ctx, (MESSAGE,), limit=512, charset=_NEWLINE)
            hdr = _header(got[0]) if got is not None and got[1] is not None else None
            if hdr is None:
                ctx.pos = start
                yield from rest_as(ctx)
                return
            channel, recipient = hdr
            if recipient.startswith("functions.") and ctx.tools_ok:
                name = recipient[len("functions.") :]

                def call(name: str = name) -> Gen:
                    if not ctx.info.accepts(name):
                        return False
                    yield from skip_ws(ctx)
                    if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != "{":
                        return False
                    yield ctx.start_call(name)
                    if (yield from json_value(ctx, emit_index=ctx.index - 1)) is None:
                        return False
                    yield from skip_ws(ctx)
                    yield from one_of(ctx, ENDS)  # tolerated when missing
                    return True

                if (yield from try_block(ctx, call())):
                    continue
            kind = ReasoningDelta if channel == "analysis" else ContentDelta
            ctx.after_block = False
            m = yield from scan_content(ctx, BODY_STOPS, kind)
            ctx.held_ws = ""
            if m is None:
                return
            if m in ENDS:
                ctx.pos += len(m)
            ctx.after_block = True

    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        fmt = '(" <|constrain|>json" | " json")?'
        g.add("call-tail", f'{fmt} ("<|channel|>commentary" {fmt})? "<|message|>"')
        calls_ = [g.add(f"call-{i}", f"{lit(' to=functions.' + n)} call-tail {a}") for i, (n, a) in enumerate(rules)]
        call = g.add("call", f'"<|channel|>commentary"? {alt(calls_)} "<|call|>"?')
        more = f'{SP} "<|start|>assistant" call'
        calls = f"{call} ({more})*" if parallel else call
        if lazy:
            return f"{calls} {SP}"
        analysis = g.not_containing("<|end|>", "an")
        return f'("<|channel|>analysis<|message|>" {analysis} "<|end|>" "<|start|>assistant")? {calls} {SP}'
