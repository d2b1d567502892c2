"""Tool-call formats: parsing model output into calls, and grammars that constrain it.

Each model family writes tool calls its own way; one module per family implements a
:class:`ToolFormat`:

- ``name``;
- ``parse(text, *, tools_offered, tools=None, reasoning_open=False) -> ParsedMessage`` (and
  ``parse_ex`` which also says whether a started call was malformed / cut off);
- ``stream_parser(tools_offered, tools=None, *, reasoning_open=False) -> StreamParser`` with
  ``feed(delta) -> list[ParseEvent]``, ``finish() -> list[ParseEvent]`` and ``truncated``;
- ``grammar(tools, tool_choice, parallel, *, reasoning=None) -> GrammarSpec | None``;
- ``handles_reasoning``: the format separates reasoning itself (gpt-oss, Command R7B).

:func:`detect_format` picks the family from a chat template's source; :func:`get_format`
looks one up by name. :func:`new_tool_call_id` makes ids for calls the model gave none.

Parsing guarantees (see ``_base`` for the mechanics):

- streaming never emits text that might be the start of a call marker, and the events of a
  stream, accumulated, equal ``parse()`` of the whole text -- except for a call that was started
  on the wire and then turned out malformed or cut off (``StreamParser.truncated``; ``parse()``
  leaves such text as content instead of "healing" it into a call);
- a call is only recognized in the format's own call syntax, to a tool that was offered (when
  ``tools`` is given); JSON in ordinary content stays content;
- no backtracking regular expression ever runs on model text.

Reasoning (``<think>`` blocks) is split off first by :mod:`llamaserve.chat.reasoning`; feed its
content to the tool parser (:func:`chain`), except for formats with ``handles_reasoning``.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable

from llamaserve.chat.parsed import ContentDelta, ParseEvent

from ._base import StreamParser, fold
from ._format import ToolChoiceError, ToolFormat, normalize_tool_choice
from ._toolinfo import ToolInfo
from .command_r7b import CommandR7BFormat
from .deepseek_r1 import DeepSeekR1Format
from .deepseek_v3 import DeepSeekV3Format
from .firefunction_v2 import FirefunctionV2Format
from .functionary_v3_1 import FunctionaryV31Format
from .functionary_v3_2 import FunctionaryV32Format
from .gemma4 import Gemma4Format
from .generic import GenericFormat
from .glm4 import HY3_TAGS, Glm4Format
from .gpt_oss import GptOssFormat
from .granite import GraniteFormat
from .hermes import HermesFormat
from .json_blocks import APERTUS, APRIEL, GIGACHAT, MINIMAX_M1, NEMOTRON_V2
from .kimi_k2 import KimiK2Format
from .lfm2 import Lfm2Format
from .llama3 import Llama3Format
from .mistral import MistralFormat
from .qwen3_coder import Qwen3CoderFormat
from .solar_open import SolarOpenFormat
from .xml_invoke import DSML_V4, DSML_V32, MINICPM5, MINIMAX_M2, XmlInvokeFormat

__all__ = [
    "FORMATS",
    "StreamParser",
    "ToolChoiceError",
    "ToolFormat",
    "ToolInfo",
    "chain",
    "detect_format",
    "fold",
    "get_format",
    "new_tool_call_id",
    "normalize_tool_choice",
]

FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (
        HermesFormat(),
        Qwen3CoderFormat(),
        Qwen3CoderFormat("seed_oss", "<seed:tool_call>", "</seed:tool_call>", newlines=False),
        Llama3Format(),
        MistralFormat(),
        MistralFormat("mistral_nemo", json_array=True),
        FunctionaryV31Format(),
        FunctionaryV32Format(),
        DeepSeekR1Format(),
        DeepSeekV3Format(),
        CommandR7BFormat(),
        FirefunctionV2Format(),
        GptOssFormat(),
        Glm4Format(),
        Glm4Format("hy3", HY3_TAGS),
        KimiK2Format(),
        GraniteFormat(),
        XmlInvokeFormat("minimax_m2", MINIMAX_M2),
        XmlInvokeFormat("deepseek_v3_2", DSML_V32),
        XmlInvokeFormat("deepseek_v4", DSML_V4),
        XmlInvokeFormat("minicpm5", MINICPM5),
        APRIEL,
        NEMOTRON_V2,
        MINIMAX_M1,
        GIGACHAT,
        APERTUS,
        Lfm2Format(),
        SolarOpenFormat(),
        Gemma4Format(),
        GenericFormat(),
    )
}
"""Every format, by name (formats are stateless and shared)."""


def get_format(name: str) -> ToolFormat:
    """A format by name (KeyError when unknown)."""
    return FORMATS[name]


def _has(src: str, *markers: str) -> bool:
    return all(m in src for m in markers)


# (test, format name), first match wins. Order matters: more specific markers come first
# (Qwen3-Coder templates also contain "<tool_call>", GLM's too, Granite 3 "<|tool_call|>"...).
_RULES: list[tuple[Callable[[str], bool], str]] = [
    (lambda s: _has(s, "<|channel|>", "<|message|>"), "gpt_oss"),
    (lambda s: _has(s, "DSML", "function_calls"), "deepseek_v3_2"),
    (lambda s: _has(s, "DSML", "tool_calls>"), "deepseek_v4"),
    (lambda s: _has(s, "<minimax:tool_call>"), "minimax_m2"),
    (lambda s: _has(s, "]<]minimax[>["), "generic"),  # MiniMax M3: not supported natively
    (lambda s: _has(s, "<|tool_call>call:"), "gemma4"),
    (lambda s: _has(s, "<|tool_call:begin|>", "<|tool_call:name|>"), "solar_open"),
    (lambda s: _has(s, "<|tools_prefix|>"), "apertus"),
    (lambda s: _has(s, "<|tool_call_start|>") or _has(s, "<|tool_list_start|>") or _has(s, "List of tools: ["), "lfm2"),
    (lambda s: _has(s, "<TOOLCALL>"), "nemotron_v2"),
    (lambda s: _has(s, "<function name=", "<param name="), "minicpm5"),
    (lambda s: _has(s, "<tool_calls>[") or _has(s, "<tool_calls>\n        ["), "apriel"),
    (lambda s: _has(s, "<tool_calls>"), "minimax_m1"),
    (lambda s: _has(s, "<|function_call|>") or _has(s, "'function call'"), "gigachat"),
    (lambda s: _has(s, "<|tool_calls_section_begin|>"), "kimi_k2"),
    (lambda s: _has(s, "<|START_ACTION|>"), "command_r7b"),
    (lambda s: _has(s, "<tool_sep", "<arg_key"), "hy3"),
    (lambda s: _has(s, "<arg_key>", "<arg_value>"), "glm4"),
    (lambda s: _has(s, "<seed:tool_call>", "<function="), "seed_oss"),
    (lambda s: _has(s, "<function=", "<parameter="), "qwen3_coder"),
    (lambda s: _has(s, "tool▁calls▁begin", "tool▁sep", "```json"), "deepseek_r1"),
    (lambda s: _has(s, "tool▁calls▁begin", "tool▁sep"), "deepseek_v3"),
    (lambda s: _has(s, "[TOOL_CALLS]", "[ARGS]"), "mistral"),
    (lambda s: _has(s, "[TOOL_CALLS]"), "mistral_nemo"),
    (lambda s: _has(s, ">>>") and "all" in s and "<|start_header_id|>" in s, "functionary_v3_2"),
    (lambda s: _has(s, "<function=", "<|start_header_id|>"), "functionary_v3_1"),
    (lambda s: _has(s, "functools["), "firefunction_v2"),
    (lambda s: _has(s, "<|tool_call|>"), "granite"),
    (lambda s: _has(s, "<tool_call>"), "hermes"),
    (lambda s: _has(s, "<|start_header_id|>", "ipython") or _has(s, "<|python_tag|>"), "llama3"),
]


def detect_format(template_source: str) -> ToolFormat:
    """The tool-call format a chat template's model uses, from markers in the template text;
    ``generic`` for templates with no native tool-call syntax."""
    src = template_source or ""
    for test, name in _RULES:
        if test(src):
            return FORMATS[name]
    return FORMATS["generic"]


_ID_ALPHABET = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    """A fresh call id: 9 random alphanumeric characters (what Mistral templates require, and
    valid for every other template)."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))


class chain:
    """Two stream parsers in a row: ``first``'s content is fed to ``second``; its other events
    (reasoning) pass through. Typically ``chain(reasoning_splitter, tool_parser)``."""

    def __init__(self, first: object, second: StreamParser) -> None:
        self.first = first
        self.second = second

    @property
    def truncated(self) -> bool:
        return self.second.truncated

    def _route(self, events: list[ParseEvent]) -> list[ParseEvent]:
        out: list[ParseEvent] = []
        for ev in events:
            if isinstance(ev, ContentDelta):
                out.extend(self.second.feed(ev.text))
            else:
                out.append(ev)
        return out

    def feed(self, delta: str) -> list[ParseEvent]:
        return self._route(self.first.feed(delta))  # type: ignore[attr-defined]

    def finish(self) -> list[ParseEvent]:
        out = self._route(self.first.finish())  # type: ignore[attr-defined]
        out.extend(self.second.finish())
        return out
