"""The machinery every tool-call format shares: an incremental parser engine.

How a format parser is written
------------------------------
A format describes the whole assistant message as one *generator*, ``run(ctx)``. It reads the
model's text through :class:`Ctx` (``ctx.buf`` / ``ctx.pos``) with small sub-generators
(:func:`scan_content`, :func:`literal`, :func:`skip_ws`, :func:`json_value`, ...), and it
``yield``\\ s either parse events (``ContentDelta``, ``ToolCallStart``, ...) or :data:`NEED`,
which means "I cannot decide before more text arrives". The same generator serves both modes:

- **streaming** (:class:`StreamParser`): ``feed()`` appends text and resumes the generator until
  it yields ``NEED``; ``finish()`` marks the text final and runs it to the end;
- **one-shot** (``parse()``): the text is final from the start, so ``NEED`` never happens.

Because a generator only makes a decision once the text it needs is present, the events do not
depend on how the text was split: streaming and ``parse()`` agree by construction (tests check
it at every split point). Nothing here uses backtracking regular expressions on model text:
markers are found with ``str.find`` and JSON is checked by a linear push-down scanner.

Call blocks and commitment
--------------------------
A call is parsed inside :func:`try_block`. Until the block yields its first event (normally the
``ToolCallStart``, emitted once the name is known to be an offered tool and the arguments have
begun) it may still *fail*: the text is then rolled back and treated as content. After that first
event the call is *committed* (its start and argument fragments may already be on the wire). A
committed call whose arguments turn out malformed or cut off (end of text) is *broken*:

- in one-shot parsing the whole call is rolled back: its text becomes content, never a fake call;
- while streaming it cannot be taken back, so :attr:`StreamParser.truncated` is set; the adapter
  must then report ``finish_reason: "length"`` (a client must not execute it).

This is the only case where streaming and one-shot parsing differ.

Whitespace: whitespace between content and a call block, between blocks, and after the last block
is dropped (it is formatting, not content); other content is passed through unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Generator, Iterable
from typing import Any

from llamaserve.chat.parsed import (
    ContentDelta,
    ParsedMessage,
    ParseEvent,
    ReasoningDelta,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallStart,
)

from ._jsonscan import _WS, DONE, ERROR, JsonScanner, escape_fixups
from ._toolinfo import ToolInfo


class _Need:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED"


NEED: Any = _Need()
"""Yielded by a parser generator that needs more text to decide."""

Gen = Generator[Any, None, Any]

_NON_WS = re.compile(r"[^ \t\r\n]")
# ---------------------------------------------------------------------------------------------
# The parsing context
# ---------------------------------------------------------------------------------------------


class Ctx:
    """Shared state of one parse: the text so far, the read position, the call counter."""

    __slots__ = (
        "after_block",
        "buf",
        "final",
        "held_ws",
        "index",
        "info",
        "pos",
        "reasoning_open",
        "streaming",
        "tools_ok",
        "truncated",
    )

    def __init__(self, info: ToolInfo, tools_ok: bool, streaming: bool, reasoning_open: bool = False) -> None:
        self.reasoning_open = reasoning_open  # the prompt opened the format's reasoning block
        self.buf = ""
        self.pos = 0
        self.final = False
        self.streaming = streaming
        self.info = info
        self.tools_ok = tools_ok
        self.index = 0  # the next call's index
        self.truncated = False
        self.after_block = False  # just after a call block: leading whitespace is dropped
        self.held_ws = ""  # whitespace before a block's opener, dropped if the block succeeds

    # Positions are only valid until the next compaction, which happens only while streaming, in
    # :func:`scan_content` and in :func:`json_value` with ``emit_index`` (after commitment).
    def compact(self) -> None:
        if self.streaming and self.pos > 4096:
            self.buf = self.buf[self.pos :]
            self.pos = 0

    def at_eof(self) -> bool:
        return self.final and self.pos >= len(self.buf)

    def start_call(self, name: str, call_id: str = "") -> ToolCallStart:
        ev = ToolCallStart(self.index, name, call_id)
        self.index += 1
        return ev


# ---------------------------------------------------------------------------------------------
# Primitive sub-generators (use with ``yield from``)
# ---------------------------------------------------------------------------------------------


def wait(ctx: Ctx, n: int = 1) -> Gen:
    """Wait until ``n`` characters are available at ``pos`` (or the text is final).
    Returns True when they are."""
    while len(ctx.buf) - ctx.pos < n:
        if ctx.final:
            return False
        yield NEED
    return True


def skip_ws(ctx: Ctx) -> Gen:
    """Skip whitespace; waits until a non-space character or the end of the text."""
    while True:
        m = _NON_WS.search(ctx.buf, ctx.pos)
        if m:
            ctx.pos = m.start()
            return
        ctx.pos = len(ctx.buf)
        if ctx.final:
            return
        yield NEED


def literal(ctx: Ctx, lit: str) -> Gen:
    """Consume ``lit`` at ``pos`` if it is there (True); otherwise leave ``pos`` (False)."""
    n = len(lit)
    while True:
        avail = ctx.buf[ctx.pos : ctx.pos + n]
        if len(avail) == n:
            if avail == lit:
                ctx.pos += n
                return True
            return False
        if not lit.startswith(avail) or ctx.final:
            return False
        yield NEED


def one_of(ctx: Ctx, lits: Iterable[str]) -> Gen:
    """Consume the longest of ``lits`` present at ``pos``; returns it or None."""
    cands = sorted(lits, key=len, reverse=True)
    while True:
        avail = ctx.buf[ctx.pos : ctx.pos + len(cands[0])]
        undecided = False
        for lit in cands:
            if avail.startswith(lit):
                if undecided:
                    break
                ctx.pos += len(lit)
                return lit
            if len(avail) < len(lit) and lit.startswith(avail) and not ctx.final:
                undecided = True
        if not undecided:
            return None
        yield NEED


def read_until(
    ctx: Ctx, stops: Iterable[str], *, limit: int | None = None, charset: re.Pattern[str] | None = None
) -> Gen:
    """Read text up to the first of ``stops``; returns (text, stop) with ``pos`` after the stop,
    or (text, None) at the end of the text (pos at the end). Fails (returns None, pos unchanged)
    when more than ``limit`` characters pass without a stop or ``charset`` (a pattern of
    *forbidden* characters) matches. Meant for short things (names, keys)."""
    stops = tuple(stops)
    longest = max(len(s) for s in stops)
    start = ctx.pos
    scanned = start
    search_from = start
    while True:
        buf = ctx.buf
        best = -1
        which = ""
        for s in stops:
            i = buf.find(s, search_from)
            if i >= 0 and (best < 0 or i < best or (i == best and len(s) > len(which))):
                best, which = i, s
        if best >= 0:
            end = best
        elif ctx.final:
            end = len(buf)
        else:
            end = len(buf) - _partial_suffix(buf, start, stops)
        if charset is not None and end > scanned and charset.search(buf, scanned, end):
            return None
        scanned = max(scanned, end)
        if limit is not None and end - start > limit:
            return None
        if best >= 0:
            ctx.pos = best + len(which)
            return buf[start:best], which
        if ctx.final:
            ctx.pos = len(buf)
            return buf[start:], None
        search_from = max(start, len(buf) - longest + 1)
        yield NEED


def _partial_suffix(buf: str, start: int, markers: Iterable[str]) -> int:
    """Length of the longest suffix of buf[start:] that is a proper prefix of a marker."""
    best = 0
    avail = len(buf) - start
    for m in markers:
        k = min(len(m) - 1, avail)
        while k > best:
            if buf.endswith(m[:k]):
                best = k
                break
            k -= 1
    return best


def scan_content(ctx: Ctx, markers: Collection[str], kind: type = ContentDelta, *, strip_end: bool = False) -> Gen:
    """Emit text as ``kind`` deltas until one of ``markers``; returns the marker found (``pos``
    at its start, trailing whitespace before it kept in ``ctx.held_ws`` and not emitted) or None
    at the end of the text. Never emits text that might be the beginning of a marker.

    Whitespace right after a call block (``ctx.after_block``) is dropped, and with
    ``strip_end`` also trailing whitespace at the end of the text.
    """
    while True:
        buf, pos = ctx.buf, ctx.pos
        if ctx.after_block:
            m = _NON_WS.search(buf, pos)
            if m is None:
                ctx.pos = len(buf)
                if ctx.final:
                    return None
                ctx.compact()
                yield NEED
                continue
            pos = ctx.pos = m.start()
            ctx.after_block = False
        best = -1
        which = None
        for mk in markers:
            i = buf.find(mk, pos)
            if i >= 0 and (best < 0 or i < best or (i == best and len(mk) > len(which or ""))):
                best, which = i, mk
        if best >= 0:
            seg = buf[pos:best]
            text = seg.rstrip(_WS)
            if text:
                yield kind(text)
            ctx.held_ws = seg[len(text) :]
            ctx.pos = best
            return which
        if ctx.final:
            if pos < len(buf):
                yield kind(buf[pos:].rstrip(_WS) if strip_end else buf[pos:])
            ctx.pos = len(buf)
            return None
        safe = len(buf) - _partial_suffix(buf, pos, markers)
        # Hold trailing whitespace too: it is dropped if a call block follows.
        seg = buf[pos:safe]
        text = seg.rstrip(_WS)
        if text:
            yield kind(text)
            ctx.pos = pos + len(text)
        ctx.compact()
        yield NEED


def emit_held_as_content(ctx: Ctx, text: str) -> Gen:
    """Content that turned out not to be a call (a failed opener), with the whitespace before it."""
    out = ctx.held_ws + text
    ctx.held_ws = ""
    if out:
        yield ContentDelta(out)


def rest_as(ctx: Ctx, kind: type = ContentDelta) -> Gen:
    """Everything from ``pos`` to the end of the text as ``kind``."""
    while True:
        if ctx.pos < len(ctx.buf):
            yield kind(ctx.buf[ctx.pos :])
            ctx.pos = len(ctx.buf)
        if ctx.final:
            return
        ctx.compact()
        yield NEED


# ---------------------------------------------------------------------------------------------
# Incremental JSON
# ---------------------------------------------------------------------------------------------
def json_value(ctx: Ctx, emit_index: int | None = None) -> Gen:
    """Scan one JSON value at ``pos`` (leading whitespace skipped). Returns its text (valid
    JSON: raw control characters in strings escaped), or None when it is malformed or cut off
    (``pos`` at the failure).

    With ``emit_index``, the text is streamed as ToolCallArgsDelta fragments for that call
    instead (and "" is returned); the buffer may then be compacted."""
    yield from skip_ws(ctx)
    sc = JsonScanner()
    start = ctx.pos
    while True:
        end, status = sc.scan(ctx.buf, ctx.pos, ctx.final)
        if emit_index is not None:
            if end > ctx.pos:
                yield ToolCallArgsDelta(emit_index, escape_fixups(ctx.buf, ctx.pos, end, sc.fixups))
            sc.fixups.clear()
        ctx.pos = end
        if status == DONE:
            return "" if emit_index is not None else escape_fixups(ctx.buf, start, end, sc.fixups)
        if status == ERROR:
            return None
        if emit_index is not None:
            ctx.compact()
        yield NEED


def json_string(ctx: Ctx) -> Gen:
    """A JSON string at ``pos`` (after whitespace), decoded; None if something else is there."""
    yield from skip_ws(ctx)
    if not (yield from wait(ctx)) or ctx.buf[ctx.pos] != '"':
        return None
    text = yield from json_value(ctx)
    if text is None:
        return None
    return json.loads(text)


# ---------------------------------------------------------------------------------------------
# Call blocks
# ---------------------------------------------------------------------------------------------


def try_block(ctx: Ctx, block: Gen, *, on_fail_content: str | None = None) -> Gen:
    """Run a call-block generator (see the module docstring). Returns True when the text it read
    is accounted for (a call, or a broken call), False when it failed before committing: ``pos``
    is then back at the block start and nothing was emitted.

    ``block`` returns a truthy value for success. With ``on_fail_content`` a failed block's
    opener text is emitted as content (with the held whitespace) and ``pos`` moved past it.
    """
    start = ctx.pos
    index0 = ctx.index
    held0 = ctx.held_ws
    committed = False
    pending: list[Any] | None = None if ctx.streaming else []
    ok: Any = False
    try:
        item = next(block)
        while True:
            if item is NEED:
                yield NEED
            else:
                if not committed:
                    committed = True
                    if ctx.held_ws:
                        ctx.held_ws = ""
                if pending is not None:
                    pending.append(item)
                else:
                    yield item
            item = next(block)
    except StopIteration as stop:
        ok = stop.value
    if ok:
        ctx.held_ws = ""
        if pending:
            yield from pending
        ctx.after_block = True
        return True
    if not committed:
        ctx.pos = start
        ctx.index = index0
        if on_fail_content is not None:
            yield from emit_held_as_content(ctx, on_fail_content)
            ctx.pos = start + len(on_fail_content)
        return False
    # committed, then broken
    ctx.truncated = True
    if not ctx.streaming:
        ctx.index = index0
        end = max(ctx.pos, start + 1)
        yield ContentDelta(held0 + ctx.buf[start:end])
        ctx.pos = end
    return True


def json_call_object(
    ctx: Ctx,
    *,
    name_keys: Collection[str] = ("name",),
    args_keys: Collection[str] = ("arguments", "parameters"),
    id_keys: Collection[str] = ("id",),
    allow_missing_args: bool = True,
    extra_check: Callable[[str, Any], bool] | None = None,
) -> Gen:
    """One call written as a JSON object ``{"name": ..., "arguments": {...}}`` (keys in any
    order, other keys ignored). Streams the arguments when the name comes first. Returns True on
    success, False on failure (committed or not: see :func:`try_block`).

    ``extra_check(key, value)`` may veto other keys' values (e.g. ``"type": "function"``).
    """
    yield from skip_ws(ctx)
    if not (yield from literal(ctx, "{")):
        return False
    name: str | None = None
    call_id = ""
    args_text: str | None = None
    started = False
    first = True
    while True:
        yield from skip_ws(ctx)
        if (yield from literal(ctx, "}")):
            if first or name is not None:
                break
            return False
        if not first and not (yield from literal(ctx, ",")):
            return False
        key = yield from json_string(ctx)
        if not isinstance(key, str):
            return False
        yield from skip_ws(ctx)
        if not (yield from literal(ctx, ":")):
            return False
        yield from skip_ws(ctx)
        first = False
        if key in name_keys and name is None:
            val = yield from json_string(ctx)
            if not isinstance(val, str) or not ctx.info.accepts(val):
                return False
            name = val
        elif key in args_keys and args_text is None and not started:
            if not (yield from wait(ctx)):
                return False
            c = ctx.buf[ctx.pos]
            if c == "{" and name is not None:
                # Commit: stream the arguments.
                started = True
                yield ctx.start_call(name, call_id)
                if (yield from json_value(ctx, emit_index=ctx.index - 1)) is None:
                    return False
                args_text = ""
            elif c == "{":
                args_text = yield from json_value(ctx)
                if args_text is None:
                    return False
            elif c == '"':
                # Arguments given as a JSON string holding the object.
                s = yield from json_string(ctx)
                try:
                    obj = json.loads(s) if isinstance(s, str) else None
                except ValueError:
                    obj = None
                if not isinstance(obj, dict):
                    return False
                args_text = s
            else:
                return False
        elif key in id_keys and not call_id:
            text = yield from json_value(ctx)
            if text is None:
                return False
            v = json.loads(text)
            if isinstance(v, (str, int)) and not isinstance(v, bool):
                call_id = str(v)
            # an id after the start of the call cannot be reported any more
        else:
            text = yield from json_value(ctx)
            if text is None:
                return False
            if extra_check is not None and not started and not extra_check(key, json.loads(text)):
                return False
    if name is None:
        return False
    if not started:
        if args_text is None:
            if not allow_missing_args:
                return False
            args_text = "{}"
        yield ctx.start_call(name, call_id)
        yield ToolCallArgsDelta(ctx.index - 1, args_text)
    return True


def emit_call(ctx: Ctx, name: str, args_text: str, call_id: str = "") -> Gen:
    """A whole call at once (formats whose arguments are only known at the end)."""
    yield ctx.start_call(name, call_id)
    yield ToolCallArgsDelta(ctx.index - 1, args_text)


# ---------------------------------------------------------------------------------------------
# Drivers
# ---------------------------------------------------------------------------------------------


def _coalesce(events: list[ParseEvent]) -> list[ParseEvent]:
    out: list[ParseEvent] = []
    for ev in events:
        if out:
            last = out[-1]
            if type(ev) is type(last):
                if isinstance(ev, (ContentDelta, ReasoningDelta)):
                    if not ev.text:
                        continue
                    out[-1] = type(ev)(last.text + ev.text)  # type: ignore[union-attr]
                    continue
                if isinstance(ev, ToolCallArgsDelta) and ev.index == last.index:  # type: ignore[union-attr]
                    out[-1] = ToolCallArgsDelta(ev.index, last.text + ev.text)  # type: ignore[union-attr]
                    continue
        if isinstance(ev, (ContentDelta, ReasoningDelta, ToolCallArgsDelta)) and not ev.text:
            continue
        out.append(ev)
    return out


class StreamParser:
    """Turns text deltas into parse events; see the module docstring.

    ``feed(delta)`` and ``finish()`` return the new events. After ``finish()``, ``truncated``
    tells whether a call was started on the wire but could not be completed (malformed or cut
    off); such a call must not be executed (report ``finish_reason: "length"``).
    """

    def __init__(
        self,
        run: Callable[[Ctx], Gen],
        info: ToolInfo,
        tools_ok: bool,
        *,
        streaming: bool = True,
        reasoning_open: bool = False,
    ) -> None:
        self._ctx = Ctx(info, tools_ok, streaming, reasoning_open)
        self._gen: Gen | None = run(self._ctx)
        self._done = False

    @property
    def truncated(self) -> bool:
        return self._ctx.truncated

    def _pump(self) -> list[ParseEvent]:
        out: list[ParseEvent] = []
        gen = self._gen
        if gen is None:
            return out
        try:
            while True:
                item = next(gen)
                if item is NEED:
                    if self._ctx.final:
                        raise RuntimeError("parser asked for more text after the end")
                    break
                out.append(item)
        except StopIteration:
            self._gen = None
            if self._ctx.pos < len(self._ctx.buf):  # a format that stopped early: the rest is content
                out.append(ContentDelta(self._ctx.buf[self._ctx.pos :]))
                self._ctx.pos = len(self._ctx.buf)
        return _coalesce(out)

    def feed(self, delta: str) -> list[ParseEvent]:
        if self._ctx.final:
            raise RuntimeError("feed() after finish()")
        if not delta:
            return []
        self._ctx.buf += delta
        if self._gen is None:
            return [ContentDelta(delta)]
        return self._pump()

    def finish(self) -> list[ParseEvent]:
        if self._ctx.final:
            return []
        self._ctx.final = True
        return self._pump()


def fold(events: Iterable[ParseEvent], into: ParsedMessage | None = None) -> ParsedMessage:
    """Accumulate parse events into a ParsedMessage (what a client does with the stream)."""
    msg = into if into is not None else ParsedMessage()
    content: list[str] = [msg.content]
    reasoning: list[str] = [msg.reasoning]
    calls = dict(enumerate(msg.tool_calls))
    args: dict[int, list[str]] = {i: [c.arguments] for i, c in calls.items()}
    for ev in events:
        if isinstance(ev, ContentDelta):
            content.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            reasoning.append(ev.text)
        elif isinstance(ev, ToolCallStart):
            calls[ev.index] = ToolCall(ev.name, "", ev.id)
            args[ev.index] = []
        elif isinstance(ev, ToolCallArgsDelta):
            args.setdefault(ev.index, []).append(ev.text)
    msg.content = "".join(content)
    msg.reasoning = "".join(reasoning)
    out = []
    for i in sorted(calls):
        c = calls[i]
        c.arguments = "".join(args.get(i, []))
        out.append(c)
    msg.tool_calls = out
    return msg


def parse_with(
    run: Callable[[Ctx], Gen], text: str, info: ToolInfo, tools_ok: bool, reasoning_open: bool = False
) -> tuple[ParsedMessage, bool]:
    """One-shot parse; returns the message and whether a broken call was rolled back."""
    p = StreamParser(run, info, tools_ok, streaming=False, reasoning_open=reasoning_open)
    p._ctx.buf = text
    p._ctx.final = True
    events = p._pump()
    return fold(events), p._ctx.truncated


def content_only(ctx: Ctx) -> Gen:
    """Everything is content."""
    yield from rest_as(ctx, ContentDelta)


def blocks_in_content(ctx: Ctx, openers: Collection[str], block_for: Callable[[str], Gen]) -> Gen:
    """The usual message shape: content with call blocks starting at ``openers`` anywhere."""
    if not ctx.tools_ok:
        yield from content_only(ctx)
        return
    while True:
        m = yield from scan_content(ctx, openers)
        if m is None:
            return
        yield from try_block(ctx, block_for(m), on_fail_content=m)


def parse_json_array_of_calls(ctx: Ctx, call: Callable[[], Gen], *, parallel_sep: str = ",") -> Gen:
    """``[call, call, ...]`` (the opener already consumed). True on success."""
    yield from skip_ws(ctx)
    if not (yield from literal(ctx, "[")):
        return False
    first = True
    n = 0
    while True:
        yield from skip_ws(ctx)
        if (yield from literal(ctx, "]")):
            return n > 0
        if not first and not (yield from literal(ctx, parallel_sep)):
            return False
        first = False
        if not (yield from call()):
            return False
        n += 1
