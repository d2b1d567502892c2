"""llama.cpp's built-in chat templates behind the :class:`PromptTemplate` seam.

``--chat-template llama3`` (or any name llama.cpp lists) selects one of the formats llama.cpp
hard-codes in C++. They take plain ``(role, content)`` pairs, so this adapter flattens the
OpenAI messages the way llama-server's non-Jinja path does (``common_chat_templates_apply_legacy``):
text parts joined with a newline, ``content: null`` as empty text, ``tool_calls`` and every
other key dropped. The native call itself is injected (``compose.py`` passes
``llama/builtin_templates.render_builtin``), which keeps this module free of llama.cpp.

What a built-in format cannot express is refused with a :class:`TemplateError` (a 400) rather
than silently dropped: a request with ``tools`` (llama-server answers "tools param requires
--jinja flag"). ``chat_template_kwargs`` are ignored, as in llama-server: the formats have no
variables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from llamaserve.chat.template import TemplateError, normalize_messages
from llamaserve.chat.template_caps import TemplateCaps

__all__ = ["BUILTIN_CAPS", "BuiltinRenderer", "BuiltinTemplate"]

# (name, [(role, content), ...], add_generation_prompt) -> prompt; raises ValueError on failure.
BuiltinRenderer = Callable[[str, Sequence[tuple[str, str]], bool], str]

# Fixed rather than probed: the formats render role and string content and nothing else. No
# thinking either: llama-server enables reasoning only for Jinja templates, so reasoning
# ``auto`` leaves the answer unsplit here too.
BUILTIN_CAPS: Final[TemplateCaps] = TemplateCaps(
    supports_tools=False,
    supports_tool_calls=False,
    supports_system_role=True,
    supports_parallel_tool_calls=False,
    supports_preserve_reasoning=False,
    supports_string_content=True,
    supports_typed_content=False,
    supports_object_arguments=False,
    supports_thinking=False,
    requires_non_null_content=True,
)


def _turn(index: int, message: Mapping[str, Any]) -> tuple[str, str]:
    role = message.get("role")
    if not isinstance(role, str):
        raise TemplateError(f"message {index} needs a string 'role'")
    content = message.get("content")
    if content is None:
        return role, ""  # an assistant turn that only carried tool calls
    if not isinstance(content, str):
        raise TemplateError(f"message {index}: content must be a string or text parts")
    return role, content


class BuiltinTemplate:
    """One of llama.cpp's built-in chat formats, by its name (``llama3``, ``gemma``, ...)."""

    def __init__(
        self,
        name: str,
        renderer: BuiltinRenderer,
        *,
        media_marker: str | None = None,
        tools_refusal: str | None = None,
    ) -> None:
        # `name` is what llama.cpp is handed: a built-in's name, or (--no-jinja) a template's
        # text, from which llama.cpp detects the format as llama-server's non-Jinja path does.
        self.name: str = name
        self._renderer: BuiltinRenderer = renderer
        self.media_marker: str | None = media_marker
        self._tools_refusal: str = tools_refusal or (
            f"tools need a Jinja chat template; llama.cpp's built-in {name!r} template "
            "cannot render them (start the server with the model's own template or --chat-template-file)"
        )

    @property
    def caps(self) -> TemplateCaps:
        return BUILTIN_CAPS

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        /,
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt llama.cpp builds for the conversation; ``kwargs`` are accepted and unused."""
        if tools:
            raise TemplateError(self._tools_refusal)
        prepared = normalize_messages(
            messages,
            concat_text_parts=True,
            parse_arguments=False,
            null_content_as_empty=True,
            media_marker=self.media_marker,
        )
        turns = [_turn(i, m) for i, m in enumerate(prepared)]
        try:
            return self._renderer(self.name, turns, add_generation_prompt)
        except ValueError as exc:
            raise TemplateError(str(exc)) from exc
