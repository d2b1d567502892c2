"""The seam between serving and whatever renders a model's chat prompt.

Two renderers stand behind it: :class:`~llamaserve.chat.template.ChatTemplate` (Jinja, the
model's own template or ``--chat-template-file``) and
:class:`~llamaserve.chat.builtin_template.BuiltinTemplate` (one of llama.cpp's hard-coded
formats, ``--chat-template llama3``). ``serving/`` is written against this protocol only, so it
never needs to know that the second one calls into llama.cpp.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from llamaserve.chat.template_caps import TemplateCaps

__all__ = ["PromptTemplate"]


class PromptTemplate(Protocol):
    """Renders OpenAI-shaped messages into a prompt string; raises ``TemplateError`` (a 400)."""

    @property
    def caps(self) -> TemplateCaps:
        """What the template can render (``supports_thinking`` decides reasoning ``auto``)."""
        ...

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        /,
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str: ...
