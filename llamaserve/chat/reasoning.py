"""Splitting a model's reasoning (``<think>…</think>``) from its answer, as llama-server does.

``--reasoning-format`` (and the per-request ``reasoning_format``) selects what happens:

- ``none``: nothing is split; the text is content as the model wrote it;
- ``deepseek`` (and ``auto``): a reasoning block at the start of the message goes to
  ``reasoning_content``, the rest is content;
- ``deepseek-legacy``: ``reasoning_content`` is filled *and* the content keeps the whole text,
  tags included (for clients that render ``<think>`` themselves).

Only a block at the very start of the message (after whitespace) is reasoning; ``<think>`` later
in the text is content. Templates that open the block in the generation prompt themselves
(``…<|im_start|>assistant\\n<think>\\n``; see :func:`template_opens_thinking`) make the model's
text start *inside* it: pass ``started_in_prompt=True``. A block that is never closed counts as
reasoning to the end of the text. Reasoning is stripped of surrounding whitespace, content of
its leading whitespace after the block.

Marker pairs understood by default: ``<think>…</think>`` (DeepSeek R1, Qwen 3, GLM, …),
``[THINK]…[/THINK]`` (Magistral / Ministral), ``<seed:think>…</seed:think>`` (Seed-OSS),
``<think:opensource>…</think:opensource>`` (Hy3), ``<|channel>thought…<channel|>`` (Gemma 4),
``<mm:think>…</mm:think>`` (MiniMax M3). gpt-oss channels and Command R7B's
``<|START_THINKING|>`` are split by their tool-call parsers (``handles_reasoning``).

The streaming splitter (:class:`ReasoningSplitter`) follows the same rules and never emits text
that could still turn out to be a marker; accumulated, its events equal
:func:`split_reasoning` of the whole text.
"""

from __future__ import annotations

from collections.abc import Sequence

from llamaserve.chat.parsed import ContentDelta, ParseEvent, ReasoningDelta
from llamaserve.chat.tools._base import Ctx, Gen, StreamParser, fold, one_of, rest_as, scan_content, skip_ws
from llamaserve.chat.tools._toolinfo import ToolInfo

__all__ = [
    "DEFAULT_MARKERS",
    "REASONING_FORMATS",
    "ReasoningSplitter",
    "split_reasoning",
    "template_opens_thinking",
]

REASONING_FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")

DEFAULT_MARKERS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),
    ("[THINK]", "[/THINK]"),
    ("<seed:think>", "</seed:think>"),
    ("<think:opensource>", "</think:opensource>"),
    ("<|channel>thought", "<channel|>"),
    ("<mm:think>", "</mm:think>"),
)


def _check_fmt(fmt: str) -> str:
    if fmt not in REASONING_FORMATS:
        raise ValueError(f"unknown reasoning format {fmt!r} (expected one of {', '.join(REASONING_FORMATS)})")
    return "deepseek" if fmt == "auto" else fmt


def _splitter(markers: Sequence[tuple[str, str]], started: bool):  # type: ignore[no-untyped-def]
    openers = tuple(o for o, _ in markers)
    closers = dict(markers)

    def run(ctx: Ctx) -> Gen:
        start = ctx.pos
        yield from skip_ws(ctx)
        opener = yield from one_of(ctx, openers)
        if started:
            # The prompt opened the block (the model may still repeat the opener).
            close = (closers[opener],) if opener else tuple(dict.fromkeys(closers.values()))
        elif opener is None:
            ctx.pos = start
            yield from rest_as(ctx, ContentDelta)
            return
        else:
            close = (closers[opener],)
        yield from skip_ws(ctx)
        m = yield from scan_content(ctx, close, ReasoningDelta, strip_end=True)
        if m is None:
            return
        ctx.pos += len(m)
        ctx.held_ws = ""
        ctx.after_block = True
        yield from scan_content(ctx, (), ContentDelta)

    return run


class ReasoningSplitter:
    """Incremental reasoning split: ``feed(delta)`` / ``finish()`` return ReasoningDelta and
    ContentDelta events (see the module docstring)."""

    def __init__(
        self,
        fmt: str = "deepseek",
        *,
        started_in_prompt: bool = False,
        markers: Sequence[tuple[str, str]] = DEFAULT_MARKERS,
    ) -> None:
        self.fmt = _check_fmt(fmt)
        self.started_in_prompt = started_in_prompt
        self._inner: StreamParser | None = None
        self._prefix = ""
        if self.fmt != "none":
            self._inner = StreamParser(_splitter(markers, started_in_prompt), ToolInfo(None), False)
        if self.fmt == "deepseek-legacy" and started_in_prompt and markers:
            self._prefix = markers[0][0]  # content shows the block the prompt opened

    def feed(self, delta: str) -> list[ParseEvent]:
        if self._inner is None:
            return [ContentDelta(delta)] if delta else []
        events = self._inner.feed(delta)
        if self.fmt == "deepseek-legacy":
            events = [e for e in events if isinstance(e, ReasoningDelta)]
            if delta:
                events.append(ContentDelta(self._prefix + delta))
                self._prefix = ""
        return events

    def finish(self) -> list[ParseEvent]:
        if self._inner is None:
            return []
        events = self._inner.finish()
        if self.fmt == "deepseek-legacy":
            events = [e for e in events if isinstance(e, ReasoningDelta)]
        return events


def split_reasoning(
    text: str,
    *,
    fmt: str = "deepseek",
    started_in_prompt: bool = False,
    markers: Sequence[tuple[str, str]] = DEFAULT_MARKERS,
) -> tuple[str, str]:
    """``(reasoning, content)`` of a complete message (see the module docstring)."""
    fmt = _check_fmt(fmt)
    if fmt == "none":
        return "", text
    s = ReasoningSplitter(fmt, started_in_prompt=started_in_prompt, markers=markers)
    msg = fold(s.feed(text) + s.finish())
    return msg.reasoning, msg.content


def template_opens_thinking(generation_prompt: str, markers: Sequence[tuple[str, str]] = DEFAULT_MARKERS) -> bool:
    """Whether a template's generation prompt (``ChatTemplate.generation_prompt(...)``) ends
    inside an open reasoning block, e.g. ``<|im_start|>assistant\\n<think>\\n``; an empty block
    (``<think>\\n\\n</think>\\n\\n``, thinking switched off) does not count."""
    for opener, closer in markers:
        i = generation_prompt.rfind(opener)
        if i >= 0 and generation_prompt.find(closer, i + len(opener)) < 0:
            return True
    return False
