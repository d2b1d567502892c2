"""Chat templates: render OpenAI-style messages into a prompt string with a model's Jinja template.

A chat template ships inside the GGUF file (``tokenizer.chat_template``) or comes from
``--chat-template-file``. Either way it is code written by someone else, and it runs on every
chat request, so it is compiled once in jinja2's ``ImmutableSandboxedEnvironment`` (the same
environment HF transformers uses, which is what template authors test against) and every failure
it can produce is turned into one exception type, :class:`TemplateError`, that the server maps to
an HTTP 400 carrying the message.

Three deliberate differences from the stock sandbox (``template_sandbox.py``, which also holds
the globals and filters real templates call): touching an
unsafe attribute (``lipsum.__globals__``) raises at once instead of rendering as empty, lists may
be appended to / popped from, because real templates (Kimi-K2) need it and every object a template
can reach is a per-render copy, and a string ``+`` None/undefined is the string, as in llama.cpp's
engine. Each render also gets llama.cpp's date variables (``template_context.py``).

The sandbox stops escapes, not waste: a template can still burn CPU or memory (nested loops, huge
string repeats); templates come from the operator's model file or command line, not from
requests, so that is accepted.

This module imports nothing outside llamaserve.chat: it is pure text work, testable without a model.

Public API:

- :class:`ChatTemplate` -- compile once, ``render()`` many times, ``caps`` for ``/props``.
- :class:`TemplateCaps` -- what the template can do, found by rendering probe conversations.
- :func:`normalize_messages` -- the message clean-up llama-server does before templating.
- :data:`CHATML_TEMPLATE` -- the fallback for models that ship no template.
- :class:`TemplateError` -- the only exception that leaves this module.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any, Final

import jinja2

from llamaserve.chat.template_caps import TemplateCaps, probe_caps
from llamaserve.chat.template_context import extra_context
from llamaserve.chat.template_sandbox import SANDBOX, TemplateError, render_error
from llamaserve.jsondepth import nests_deeper

__all__ = [
    "CHATML_TEMPLATE",
    "ChatTemplate",
    "TemplateCaps",
    "TemplateError",
    "normalize_messages",
]


# ---------------------------------------------------------------------------------------------
# The fallback template
# ---------------------------------------------------------------------------------------------

# Used when a GGUF has no ``tokenizer.chat_template`` (llama-server falls back to ChatML too).
# Written to survive what the OpenAI API allows: ``content`` may be null on an assistant message
# that only carries tool calls, so it renders as empty text instead of the string "None".
# The ``{{- ... }}`` / ``{%- ... %}`` whitespace control keeps the output free of template
# indentation; the only newlines in the output are the ones inside the string literals.
CHATML_TEMPLATE: Final[str] = (
    "{%- for message in messages -%}\n"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}\n"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- endif -%}\n"
    "{{- '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n"
)


# ---------------------------------------------------------------------------------------------
# Message normalization
# ---------------------------------------------------------------------------------------------

# Names render() always sets; request kwargs (chat_template_kwargs) cannot replace them, so a
# client cannot swap out the conversation or the globals the template relies on.
_RESERVED_NAMES: Final[frozenset[str]] = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"} | set(SANDBOX.globals)
)


# Tool-call arguments parsed from a JSON string only when they nest no deeper than this.
MAX_ARGUMENT_DEPTH = 64

# Content-part types whose ``text`` is prompt text. "input_text"/"output_text" are the OpenAI
# Responses API spellings; accepting them here costs nothing.
_TEXT_PART_TYPES: Final[frozenset[str]] = frozenset({"text", "input_text", "output_text"})


def _normalize_content(content: Any, *, concat_text_parts: bool, media_marker: str | None) -> Any:
    if not isinstance(content, list):
        return content  # a string, None, or something the template may know how to handle
    parts: list[dict[str, Any]] = []
    has_media = False
    for part in content:
        if not isinstance(part, Mapping):
            raise TemplateError(f"content part must be an object, got {type(part).__name__}")
        kind = part.get("type")
        if kind in _TEXT_PART_TYPES:
            text = part.get("text")
            if not isinstance(text, str):
                raise TemplateError(f"content part of type '{kind}' needs a string 'text'")
            parts.append({"type": "text", "text": text})
        elif media_marker is not None:
            # llama-server replaces each image/audio part by its media marker text before
            # templating; the multimodal layer later finds the markers in the prompt.
            parts.append({"type": "media_marker", "text": media_marker})
            has_media = True
        else:
            raise TemplateError(f"unsupported content part type: {kind!r}")
    if concat_text_parts or has_media:
        # llama-server's joining (common/chat.cpp): text parts separated by one newline, none
        # before or after a media marker; content with media is always one string.
        text = ""
        after_marker = False
        for p in parts:
            if p["type"] == "text":
                if text and not after_marker:
                    text += "\n"
                after_marker = False
            else:
                after_marker = True
            text += p["text"]
        return text
    return parts


def _normalize_tool_calls(tool_calls: Any, *, parse_arguments: bool) -> Any:
    if not isinstance(tool_calls, list) or not parse_arguments:
        return tool_calls
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            continue
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except (ValueError, RecursionError):
                continue  # keep the client's string; the template may still print it
            # Only an object replaces the string: templates iterate ``arguments.items()`` or
            # ``arguments | tojson`` expecting a mapping, and a bare number or list is not one.
            # One nested deeper than any real call stays a string: copying and rendering it
            # would recurse past Python's limit.
            if isinstance(parsed, dict) and not nests_deeper(parsed, MAX_ARGUMENT_DEPTH):
                function["arguments"] = parsed
    return tool_calls


def normalize_messages(
    messages: Iterable[Mapping[str, Any]],
    *,
    concat_text_parts: bool = True,
    parse_arguments: bool = True,
    null_content_as_empty: bool = False,
    media_marker: str | None = None,
) -> list[dict[str, Any]]:
    """Return a deep copy of ``messages`` shaped the way chat templates expect.

    - Content-part arrays (``[{"type": "text", "text": ...}, ...]``) become one string, the
      text parts joined with ``"\\n"`` (llama-server does the same), unless
      ``concat_text_parts`` is False -- for templates that only understand typed content -- in
      which case the array is kept with every part reduced to ``{"type": "text", "text": ...}``.
      Non-text parts become ``media_marker`` text when one is given (the multimodal path), and
      are a :class:`TemplateError` otherwise.
    - ``tool_calls[i].function.arguments`` given as a JSON string (as the OpenAI API sends it)
      is parsed into a dict when ``parse_arguments`` is True, because Qwen, Hermes, Llama 3.1
      and most others render it with ``| tojson`` or iterate its items; a string that is not a
      JSON object is kept as it is.
    - ``content: null`` becomes ``""`` when ``null_content_as_empty`` is True, for templates
      that cannot take null (see ``TemplateCaps.requires_non_null_content``); otherwise null
      stays null, which some templates (DeepSeek R1 distills) test for with ``is none``.
    - Everything else (``reasoning_content``, ``tool_call_id``, ``name``, unknown keys) passes
      through untouched.

    The copy matters: templates may mutate lists (see ``_ALLOWED_LIST_MUTATORS``), and the
    caller's request objects must come out of a render unchanged.
    """
    result: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TemplateError(f"message {index} must be an object, got {type(message).__name__}")
        msg = copy.deepcopy(dict(message))
        if null_content_as_empty and "content" in msg and msg["content"] is None:
            msg["content"] = ""
        elif "content" in msg:
            msg["content"] = _normalize_content(
                msg["content"], concat_text_parts=concat_text_parts, media_marker=media_marker
            )
        if "tool_calls" in msg:
            msg["tool_calls"] = _normalize_tool_calls(msg["tool_calls"], parse_arguments=parse_arguments)
        result.append(msg)
    return result


# ---------------------------------------------------------------------------------------------
# The template
# ---------------------------------------------------------------------------------------------


class ChatTemplate:
    """A compiled chat template.

    Construct once per model (compilation and the capability probes cost milliseconds); call
    :meth:`render` per request, from any thread. ``bos_token``/``eos_token`` are the model's
    token texts, which templates interpolate. ``media_marker`` is the text that stands for an
    image or audio part in the prompt when the model has a multimodal projector; without one,
    such parts are rejected (see :func:`normalize_messages`). It is fixed here rather than per
    render so that no request keyword can collide with it.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        media_marker: str | None = None,
    ) -> None:
        self.source: str = source
        self.bos_token: str = bos_token
        self.eos_token: str = eos_token
        self.media_marker: str | None = media_marker
        try:
            self._template: jinja2.Template = SANDBOX.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"chat template syntax error at line {exc.lineno}: {exc.message}") from exc
        except Exception as exc:  # any other compile failure is still a bad template
            raise TemplateError(f"chat template failed to compile: {exc}") from exc

    # -- rendering --------------------------------------------------------------------------

    def _render_prepared(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None,
        extra: Mapping[str, Any],
    ) -> str:
        # llama.cpp's date variables, then request kwargs over them, then the fixed names below
        # over both, so a client cannot replace the conversation or the globals.
        context = extra_context(datetime.now(), tools=tools)
        context.update((k, v) for k, v in extra.items() if k not in _RESERVED_NAMES)
        context["messages"] = messages
        context["add_generation_prompt"] = add_generation_prompt
        context["bos_token"] = self.bos_token
        context["eos_token"] = self.eos_token
        # Like llama.cpp, ``tools`` is left undefined when there are none (an empty list
        # included): ``tools is defined`` then means "tools were given", and Undefined still
        # behaves as empty for ``if tools``, ``tools | length`` and ``for t in tools``.
        if tools:
            context["tools"] = tools
        try:
            return self._template.render(context)
        except Exception as exc:  # untrusted code: every failure becomes a clean 400
            raise render_error(exc) from exc

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        /,
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render a conversation into the prompt string.

        ``messages`` and ``tools`` are OpenAI-shaped; they are normalized (see
        :func:`normalize_messages`) according to this template's :attr:`caps`, and deep-copied
        so the caller's objects come back unchanged. ``kwargs`` (``chat_template_kwargs``:
        ``enable_thinking``, ``reasoning_effort``, ...) become template variables, except the
        names render() sets itself (the caller should drop ``add_generation_prompt`` and
        ``tools`` from client kwargs before spreading them here, or Python reports a duplicate
        argument). Raises :class:`TemplateError` on any failure.
        """
        caps = self.caps
        prepared = normalize_messages(
            messages,
            # Keep the parts array only for templates that cannot take a plain string.
            concat_text_parts=caps.supports_string_content or not caps.supports_typed_content,
            parse_arguments=caps.supports_object_arguments or not caps.supports_tool_calls,
            null_content_as_empty=caps.requires_non_null_content,
            media_marker=self.media_marker,
        )
        tool_list = copy.deepcopy([dict(t) for t in tools]) if tools else None
        return self._render_prepared(
            prepared,
            add_generation_prompt=add_generation_prompt,
            tools=tool_list,
            extra=copy.deepcopy(kwargs),
        )

    def generation_prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        /,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The text ``add_generation_prompt=True`` appends (e.g. ``<|im_start|>assistant\\n``,
        or one ending in ``<think>\\n`` for templates that open the reasoning block themselves).

        The reasoning parser needs it, because the model's output then starts inside that
        block. Found as the suffix by which the two renders differ; "" when the render without
        it is not a prefix of the render with it (a template that rewrites earlier turns).
        """
        with_prompt = self.render(messages, add_generation_prompt=True, tools=tools, **kwargs)
        without = self.render(messages, add_generation_prompt=False, tools=tools, **kwargs)
        if with_prompt.startswith(without):
            return with_prompt[len(without) :]
        return ""

    # -- capabilities -----------------------------------------------------------------------

    def _probe(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str | None:
        # Probes render exactly what they build (no normalization: they test the raw shapes),
        # and a template that fails on a probe simply lacks that capability: None.
        try:
            return self._render_prepared(
                copy.deepcopy(messages),
                add_generation_prompt=add_generation_prompt,
                tools=copy.deepcopy(tools),
                extra={},
            )
        except TemplateError:
            return None

    @cached_property
    def caps(self) -> TemplateCaps:
        """Capabilities, computed on first use and cached (rendering is deterministic apart
        from dates, so two threads racing here compute the same value)."""
        return probe_caps(self._probe, self.source)
