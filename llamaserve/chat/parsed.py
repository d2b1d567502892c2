"""What an assistant turn becomes once the model's raw text is parsed.

Shared by the tool-call and reasoning parsers (which produce these) and the
API adapters (OpenAI chat, Anthropic Messages, OpenAI Responses) that shape
them for clients. Imports nothing of ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object as text, exactly as it will be sent to the client
    id: str = ""  # 9 alphanumeric characters, assigned by the adapter when the model gives none


@dataclass
class ParsedMessage:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


# Streaming: the parser turns text deltas into these, in order. Concatenating
# them reproduces the ParsedMessage of the whole text.
@dataclass
class ContentDelta:
    text: str


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ToolCallStart:
    index: int  # 0-based position of the call in this turn
    name: str
    id: str = ""


@dataclass
class ToolCallArgsDelta:
    index: int
    text: str  # a fragment of the arguments JSON text


ParseEvent = ContentDelta | ReasoningDelta | ToolCallStart | ToolCallArgsDelta


@dataclass
class GrammarSpec:
    """How generation is constrained for tools.

    gbnf: the grammar; triggers: regex patterns that switch a lazy grammar on
    (empty: the grammar applies from the first token); stops: extra stop
    strings the format needs.
    """

    gbnf: str
    triggers: tuple[str, ...] = ()
    stops: tuple[str, ...] = ()
