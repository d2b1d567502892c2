"""DeepSeek's tool-call tokens, shared by ``deepseek_r1`` and ``deepseek_v3``.

Both shapes are parsed by either format (the models are not always faithful to their own):
R1 ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``
and V3.1 ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``, inside
``<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>`` (the outer tags are tolerated when missing). The
``▁`` is also accepted as ``_`` or a space, as models sometimes spell it.
"""

from __future__ import annotations

import re

from ._base import Ctx, Gen, json_value, literal, one_of, read_until, skip_ws, wait


def _variants(token: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys((token, token.replace("▁", "_"), token.replace("▁", " "))))


CALLS_BEGIN = _variants("<｜tool▁calls▁begin｜>")
CALLS_END = _variants("<｜tool▁calls▁end｜>")
CALL_BEGIN = _variants("<｜tool▁call▁begin｜>")
CALL_END = _variants("<｜tool▁call▁end｜>")
SEP = _variants("<｜tool▁sep｜>")
OPENERS = CALLS_BEGIN + CALL_BEGIN
_NAME_BAD = re.compile(r"[\s<>{}\"｜]")


def call(ctx: Ctx) -> Gen:
    """One ``<｜tool▁call▁begin｜>…<｜tool▁call▁end｜>`` (the begin tag already consumed)."""
    got = yield from read_until(ctx, SEP, limit=256, charset=_NAME_BAD)
    if got is None or got[1] is None:
        return False
    head = got[0].strip()
    yield from skip_ws(ctx)
    if not (yield from wait(ctx)):
        return False
    fenced = False
    if ctx.buf[ctx.pos] == "{":  # V3.1
        name = head
    else:  # R1: type, then the name on its line, then a ```json fence
        if head != "function":
            return False
        got = yield from read_until(ctx, ("\n",), limit=256)
        if got is None or got[1] is None:
            return False
        name = got[0].strip()
        yield from skip_ws(ctx)
        fenced = bool((yield from one_of(ctx, ("```json", "```"))))
        yield from skip_ws(ctx)
        if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != "{":
            return False
    if not ctx.info.accepts(name):
        return False
    yield ctx.start_call(name)
    if (yield from json_value(ctx, emit_index=ctx.index - 1)) is None:
        return False
    yield from skip_ws(ctx)
    if fenced:
        yield from literal(ctx, "```")
        yield from skip_ws(ctx)
    yield from one_of(ctx, CALL_END)  # tolerated when missing
    return True


def block(ctx: Ctx, opener: str) -> Gen:
    """Calls, starting at the section or the first call's begin tag."""
    if opener in CALLS_BEGIN:
        yield from literal(ctx, opener)
    n = 0
    while True:
        yield from skip_ws(ctx)
        if n and (yield from one_of(ctx, CALLS_END)):
            return True
        if not (yield from one_of(ctx, CALL_BEGIN)):
            return n > 0
        if not (yield from call(ctx)):
            return False
        n += 1
