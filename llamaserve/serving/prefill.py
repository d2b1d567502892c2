"""Assistant prefill: a conversation that ends with an assistant message continues it.

llama-server (`--prefill-assistant`, the default) renders the messages before
that last one with the generation prompt and lets the model go on from the
message's text; with `--no-prefill-assistant` the message is a finished turn and
a new one starts after it. `continue_final_message` (vLLM's and transformers'
name) asks for the same continuation explicitly, whatever the flag says.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamaserve.errors import APIError
from llamaserve.families.chat.protocol import ChatMessage


@dataclass(frozen=True)
class RenderPlan:
    """What the template renders: these messages, then `prefill` (None: nothing continued)."""

    messages: list[ChatMessage]
    prefill: str | None
    add_generation_prompt: bool


def _text(message: ChatMessage) -> str:
    content = message.content
    if isinstance(content, list):
        # Text parts are joined by a blank line, as llama-server flattens them.
        return "\n\n".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    return content or ""


def continues(value: bool | str | None) -> bool:
    """llama-server's reading of continue_final_message: true, "content" or "reasoning_content"."""
    return value is True or value in ("content", "reasoning_content")


def split_prefill(
    messages: list[ChatMessage],
    enabled: bool,
    *,
    continue_final: bool | str | None = None,
    add_generation_prompt: bool | None = None,
) -> RenderPlan:
    """The messages to render and the text the answer continues."""
    explicit = continues(continue_final)
    add_prompt = True if add_generation_prompt is None else add_generation_prompt
    last_is_assistant = bool(messages) and messages[-1].role == "assistant"
    if not explicit and enabled and last_is_assistant:
        if len(messages) >= 2 and messages[-2].role == "assistant":
            raise APIError("Cannot have 2 or more assistant messages at the end of the list.")
        add_prompt = False  # the implicit prefill replaces the generation prompt, as in llama-server
        explicit = True
    if not explicit:
        return RenderPlan(messages, None, add_prompt)
    if add_prompt:
        raise APIError("Cannot set both add_generation_prompt and continue_final_message to true.")
    if not last_is_assistant:
        # Nothing to continue: the conversation is rendered as it is, without a new turn.
        return RenderPlan(messages, None, False)
    if messages[-1].tool_calls:
        raise APIError("Cannot continue an assistant message that contains tool calls.")
    return RenderPlan(messages[:-1], _text(messages[-1]), True)
