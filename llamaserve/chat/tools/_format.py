"""The ToolFormat interface every family implements (see ``llamaserve.chat.tools``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from llamaserve.chat.parsed import GrammarSpec, ParsedMessage

from . import _base
from ._base import Ctx, Gen, StreamParser
from ._grammar import SP, SP_RULE, GrammarBuilder
from ._toolinfo import ToolInfo, tool_name, tool_parameters

# A tool argument grammar handed to a format: (tool name, rule matching its JSON arguments).
ToolRule = tuple[str, str]


class ToolChoiceError(ValueError):
    """A tool_choice that cannot be honoured (a named function that is not among the tools)."""


def normalize_tool_choice(tool_choice: Any) -> tuple[str, str | None]:
    """("auto" | "required" | "none" | "named", name). Accepts the OpenAI shapes
    (``"auto"``, ``{"type":"function","function":{"name":..}}``) and a bare ``{"name": ..}``;
    ``"any"`` (Anthropic) means required."""
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        tc = tool_choice.strip().lower()
        if tc in ("auto", "none", "required"):
            return tc, None
        if tc == "any":
            return "required", None
        raise ToolChoiceError(f"unknown tool_choice {tool_choice!r}")
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else tool_choice.get("name")
        if isinstance(name, str) and name:
            return "named", name
        t = tool_choice.get("type")
        if isinstance(t, str) and t in ("auto", "none", "required", "any"):
            return normalize_tool_choice(t)
    raise ToolChoiceError(f"invalid tool_choice {tool_choice!r}")


class ToolFormat(ABC):
    """One tool-call format family.

    Subclasses implement :meth:`run` (the message parser, a generator over :class:`Ctx`; see
    ``_base``) and :meth:`build_grammar`. Instances are stateless and shared between requests.
    """

    name: str = "?"
    #: True when the format itself separates reasoning (gpt-oss channels, Command R7B thinking):
    #: the generic ``<think>`` splitter should then not run in front of it.
    handles_reasoning: bool = False
    #: the reasoning block markers of such a format, for ``template_opens_thinking`` (to know
    #: when to pass ``reasoning_open=True``)
    reasoning_markers: tuple[tuple[str, str], ...] = ()
    #: regex patterns (llama.cpp lazy-grammar triggers) that start a call in ``auto`` mode
    triggers: tuple[str, ...] = ()
    #: extra stop strings the format needs while tools are on
    stops: tuple[str, ...] = ()

    # -- parsing ----------------------------------------------------------------------------

    @abstractmethod
    def run(self, ctx: Ctx) -> Gen:
        """The message parser (a generator; see ``_base``)."""

    def parse_ex(
        self,
        text: str,
        *,
        tools_offered: bool,
        tools: Iterable[Mapping[str, Any]] | None = None,
        reasoning_open: bool = False,
    ) -> tuple[ParsedMessage, bool]:
        """Like :meth:`parse`, also returning whether a started call was malformed or cut off
        (its text was left as content)."""
        return _base.parse_with(self.run, text, ToolInfo(tools), bool(tools_offered), reasoning_open)

    def parse(
        self,
        text: str,
        *,
        tools_offered: bool,
        tools: Iterable[Mapping[str, Any]] | None = None,
        reasoning_open: bool = False,
    ) -> ParsedMessage:
        """Parse a complete assistant message.

        ``tools_offered``: tools were given with the request (with False, only a format's
        built-in structure such as gpt-oss channels is parsed; no call is ever produced).
        ``tools``: the OpenAI-shaped tool list; when given, only calls to these names are
        recognized (anything else stays content) and XML-style arguments are typed from the
        schemas. Without it any name is accepted. ``reasoning_open``: for formats that handle
        reasoning themselves (:attr:`handles_reasoning`), the generation prompt already opened
        the reasoning block (the text starts inside it).
        """
        return self.parse_ex(text, tools_offered=tools_offered, tools=tools, reasoning_open=reasoning_open)[0]

    def stream_parser(
        self, tools_offered: bool, tools: Iterable[Mapping[str, Any]] | None = None, *, reasoning_open: bool = False
    ) -> StreamParser:
        """A fresh incremental parser (``feed(delta)``, ``finish()``, ``truncated``); arguments
        as for :meth:`parse`."""
        return StreamParser(self.run, ToolInfo(tools), bool(tools_offered), reasoning_open=reasoning_open)

    # -- grammar ----------------------------------------------------------------------------

    def grammar(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: Any = "auto",
        parallel: bool = True,
        *,
        reasoning: str | None = None,
        reasoning_markers: tuple[str, str] = ("<think>", "</think>"),
    ) -> GrammarSpec | None:
        """The grammar constraining tool calls, or None when nothing is constrained.

        - ``auto``: a lazy grammar, switched on by :attr:`triggers` (free text before a call);
        - ``required``: applies from the first token, the reply is one or more calls;
        - a named function (``{"type":"function","function":{"name":..}}``): like required,
          with that tool only (:class:`ToolChoiceError` when it is not among ``tools``);
        - ``none`` or no tools: None.

        ``parallel`` False allows exactly one call. ``reasoning`` (non-lazy grammars only):
        ``"optional"`` lets a ``<think>…</think>`` block come first, ``"open"`` means the prompt
        already opened it (the reply starts inside it).
        """
        mode, wanted = normalize_tool_choice(tool_choice)
        tools = [t for t in (tools or []) if isinstance(t, Mapping) and tool_name(t)]
        if mode == "none" or not tools:
            if mode == "named":
                raise ToolChoiceError(f"tool_choice names {wanted!r} but no tools were given")
            return None
        if mode == "named":
            tools = [t for t in tools if tool_name(t) == wanted]
            if not tools:
                raise ToolChoiceError(f"tool_choice names {wanted!r}, which is not among the tools")
            tools = tools[:1]
        g = GrammarBuilder()
        g.add(SP, SP_RULE)
        rules: list[ToolRule] = []
        for i, t in enumerate(tools):
            rules.append((tool_name(t), g.schema(tool_parameters(t), f"t{i}", tool=tool_name(t))))
        lazy = mode == "auto"
        root = self.build_grammar(g, tools, rules, parallel=parallel, lazy=lazy)
        if not lazy and reasoning in ("optional", "open"):
            open_m, close_m = reasoning_markers
            body = g.not_containing(close_m, "think")
            from ._grammar import lit

            block = f"{body} {lit(close_m)} {SP}"
            if reasoning == "optional":
                root = f"({SP} {lit(open_m)} {block})? {root}"
            else:
                root = f"{block} {root}"
        triggers = self.lazy_triggers(rules) if lazy else ()
        return GrammarSpec(g.text(root), triggers, self.stops)

    def lazy_triggers(self, rules: list[ToolRule]) -> tuple[str, ...]:
        """Trigger patterns of the ``auto`` grammar (default: :attr:`triggers`)."""
        return self.triggers

    @abstractmethod
    def build_grammar(
        self, g: GrammarBuilder, tools: list[Mapping[str, Any]], rules: list[ToolRule], *, parallel: bool, lazy: bool
    ) -> str:
        """Add the format's rules to ``g`` and return the root body. When ``lazy``, the root
        starts where a trigger pattern matched (the opener). ``rules[i]`` is ``(name, rule)``
        of ``tools[i]``, the rule matching its JSON arguments."""

    def __repr__(self) -> str:
        return f"<ToolFormat {self.name}>"
