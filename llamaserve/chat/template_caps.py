"""What a chat template can render, found by rendering small probe conversations.

Split from template.py: the probes only need a way to render (``probe``), which
returns None when the template fails on a probe.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

Probe = Callable[..., "str | None"]

# ---------------------------------------------------------------------------------------------
# Capabilities
# ---------------------------------------------------------------------------------------------

# Text that, found in a template's source, means the model was trained to reason before it
# answers: a think tag (``<think>`` also matches ``<thinking>``; Mistral uses ``[THINK]``), or a
# switch/field for reasoning that the template reads. A hint for ``--reasoning auto``, nothing
# more: which parser extracts the reasoning is decided elsewhere.
_THINKING_MARKERS: Final[tuple[str, ...]] = (
    "<think>",
    "[THINK]",
    "enable_thinking",
    "reasoning_content",
    "reasoning_effort",
)


@dataclass(frozen=True, slots=True)
class TemplateCaps:
    """What a chat template can render, found by rendering small probe conversations.

    The first eight fields have the names and meaning of llama.cpp's ``chat_template_caps`` in
    ``/props`` (see :meth:`to_props`); ``supports_thinking`` is ours, from a scan of the source.

    - ``supports_tools``: a tool definition passed in ``tools`` shows up in the prompt.
    - ``supports_tool_calls``: an assistant message's ``tool_calls`` show up in the prompt.
    - ``supports_system_role``: a system message renders (no exception) and its text shows up.
    - ``supports_parallel_tool_calls``: two tool calls in one message both show up.
    - ``supports_preserve_reasoning``: ``reasoning_content`` of an earlier assistant turn (one
      followed by another user turn) shows up; most templates drop old reasoning.
    - ``supports_string_content`` / ``supports_typed_content``: user content given as a string /
      as an array of text parts shows up. At least one is expected to be true.
    - ``supports_object_arguments``: tool-call arguments given as a dict render as JSON (not as
      a Python ``{'k': ...}`` repr); when False, render() keeps argument strings as strings.
    - ``supports_thinking``: the source mentions a reasoning marker (see ``_THINKING_MARKERS``).
    - ``requires_non_null_content``: the template breaks on ``content: null`` (the OpenAI shape
      of a tool-call-only assistant message) -- it fails (Qwen3: ``'</think>' in content``) or
      prints "None"/"null" -- but renders ``""`` correctly, so render() passes ``""`` instead.
      llama.cpp's template engine applies the same fix; it is not part of ``/props``.
    """

    supports_tools: bool
    supports_tool_calls: bool
    supports_system_role: bool
    supports_parallel_tool_calls: bool
    supports_preserve_reasoning: bool
    supports_string_content: bool
    supports_typed_content: bool
    supports_object_arguments: bool
    supports_thinking: bool
    requires_non_null_content: bool

    def to_props(self) -> dict[str, bool]:
        """The ``chat_template_caps`` object of ``/props``, keyed like llama.cpp's."""
        props = asdict(self)
        del props["supports_thinking"]
        del props["requires_non_null_content"]
        return props


# Unusual strings that will not occur in a template by accident, so finding one in the output
# proves the probe's input reached the prompt.
_NEEDLE_SYSTEM: Final[str] = "<System Needle 7f3a>"
_NEEDLE_USER: Final[str] = "<User Needle 7f3a>"
_NEEDLE_TOOL: Final[str] = "tool_needle_7f3a"
_NEEDLE_TOOL_2: Final[str] = "second_tool_needle_7f3a"
_NEEDLE_ARG: Final[str] = "argument_needle_7f3a"
_NEEDLE_VALUE: Final[str] = "value_needle_7f3a"
_NEEDLE_REASONING: Final[str] = "<Reasoning Needle 7f3a>"
# Mistral templates insist on 9 alphanumeric characters in tool-call ids.
_PROBE_CALL_ID: Final[str] = "call7f3a1"
_PROBE_CALL_ID_2: Final[str] = "call7f3a2"


def _probe_tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "A probe tool.",
            "parameters": {
                "type": "object",
                "properties": {_NEEDLE_ARG: {"type": "string", "description": "An argument."}},
                "required": [_NEEDLE_ARG],
            },
        },
    }


def _probe_call(call_id: str, name: str, arguments: object) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_call_conversation(calls: list[dict[str, Any]], content: str | None) -> list[dict[str, Any]]:
    # user -> assistant(tool_calls) -> one tool result per call, the shape of a real second
    # request in a tool loop. No user turn follows: Mistral-style templates count the tool
    # exchange as no turn at all and would then reject two user turns in a row.
    conversation: list[dict[str, Any]] = [
        {"role": "user", "content": "Hey"},
        {"role": "assistant", "content": content, "tool_calls": calls},
    ]
    for call in calls:
        conversation.append(
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "name": call["function"]["name"],
                "content": "ok",
            }
        )
    return conversation


# How a template that prints arguments meant as a string shows a dict instead: Python's repr.
# (Single quotes alone prove nothing: LFM2.5 writes calls as ``f(arg='value')`` on purpose.)
_ARGUMENTS_REPR: Final[str] = repr({_NEEDLE_ARG: _NEEDLE_VALUE})


def _shows_calls(out: str, names: Iterable[str]) -> bool:
    # Every call shows up with its argument value (which, unlike the argument's name, appears
    # nowhere in the tool schema), and the arguments are not a Python dict repr.
    return all(n in out for n in names) and _NEEDLE_VALUE in out and _ARGUMENTS_REPR not in out


def _null_words(out: str) -> int:
    return out.count("None") + out.count("null")


def probe_caps(probe: Probe, source: str) -> TemplateCaps:
    """Render the probe conversations through ``probe`` and read what shows up."""
    user = {"role": "user", "content": _NEEDLE_USER}

    string_content = _NEEDLE_USER in (probe([user], add_generation_prompt=True) or "")
    typed_out = (
        probe(
            [{"role": "user", "content": [{"type": "text", "text": _NEEDLE_USER}]}],
            add_generation_prompt=True,
        )
        or ""
    )
    # A template that prints the list itself would show the needle inside a Python repr of
    # the part dicts; that is not support for typed content.
    typed_content = _NEEDLE_USER in typed_out and "'type'" not in typed_out

    system_out = probe(
        [{"role": "system", "content": _NEEDLE_SYSTEM}, {"role": "user", "content": "Hey"}],
        add_generation_prompt=True,
    )
    system_role = _NEEDLE_SYSTEM in (system_out or "")

    tools_out = probe([user], tools=[_probe_tool(_NEEDLE_TOOL)], add_generation_prompt=True)
    supports_tools = _NEEDLE_TOOL in (tools_out or "")

    probe_tools = [_probe_tool(_NEEDLE_TOOL), _probe_tool(_NEEDLE_TOOL_2)]
    object_args: dict[str, Any] = {_NEEDLE_ARG: _NEEDLE_VALUE}
    shapes: dict[str, object] = {"object": object_args, "string": json.dumps(object_args)}

    def call_out(arguments: object, content: str | None, names: Sequence[str]) -> str | None:
        call_ids = (_PROBE_CALL_ID, _PROBE_CALL_ID_2)
        calls = [_probe_call(cid, name, arguments) for cid, name in zip(call_ids, names, strict=False)]
        return probe(
            _tool_call_conversation(calls, content),
            tools=probe_tools,
            add_generation_prompt=True,
        )

    # One tool call, arguments as dict and as JSON string, content null and "".
    single = {
        (arg_shape, probe_content): call_out(arguments, probe_content, [_NEEDLE_TOOL])
        for arg_shape, arguments in shapes.items()
        for probe_content in (None, "")
    }
    shown = {key: _shows_calls(out or "", [_NEEDLE_TOOL]) for key, out in single.items()}
    object_arguments = shown[("object", None)] or shown[("object", "")]
    string_arguments = shown[("string", None)] or shown[("string", "")]
    tool_calls = object_arguments or string_arguments

    # Judge null content with the argument shape render() will use for this template, by
    # whether the conversation renders at all, not whether the calls show: templates that
    # ignore tool_calls (LFM2, Granite 3.3) still print or choke on the null content.
    shape = "object" if object_arguments else "string"
    null_out, empty_out = single[(shape, None)], single[(shape, "")]
    requires_non_null_content = empty_out is not None and (
        null_out is None or _null_words(null_out) > _null_words(empty_out)
    )
    call_content: str | None = "" if requires_non_null_content else None

    parallel_out = call_out(shapes[shape], call_content, [_NEEDLE_TOOL, _NEEDLE_TOOL_2])
    parallel = tool_calls and _shows_calls(parallel_out or "", [_NEEDLE_TOOL, _NEEDLE_TOOL_2])

    reasoning_out = probe(
        [
            {"role": "user", "content": "Hey"},
            {
                "role": "assistant",
                "content": "Hello",
                "reasoning_content": _NEEDLE_REASONING,
            },
            {"role": "user", "content": "Again"},
        ],
        add_generation_prompt=True,
    )
    preserve_reasoning = _NEEDLE_REASONING in (reasoning_out or "")

    return TemplateCaps(
        supports_tools=supports_tools,
        supports_tool_calls=tool_calls,
        supports_system_role=system_role,
        supports_parallel_tool_calls=parallel,
        supports_preserve_reasoning=preserve_reasoning,
        supports_string_content=string_content,
        supports_typed_content=typed_content,
        supports_object_arguments=object_arguments,
        supports_thinking=any(marker in source for marker in _THINKING_MARKERS),
        requires_non_null_content=requires_non_null_content,
    )
