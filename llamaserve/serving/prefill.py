"""Assistant prefill: a conversation that ends with an assistant message continues it.

llama-server (`--prefill-assistant`, the default) renders the messages before
that last one with the generation prompt and lets the model go on from the
message's text; with `--no-prefill-assistant` the message is a finished turn and
a new one starts after it.
"""

from __future__ import annotations

from llamaserve.errors import APIError
from llamaserve.protocol.openai import ChatMessage


def _text(message: ChatMessage) -> str:
    content = message.content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    return content or ""


def split_prefill(messages: list[ChatMessage], enabled: bool) -> tuple[list[ChatMessage], str | None]:
    """(the messages to render, the text the answer continues); None: nothing is prefilled."""
    if not enabled or not messages or messages[-1].role != "assistant":
        return messages, None
    if len(messages) >= 2 and messages[-2].role == "assistant":
        raise APIError("Cannot have 2 or more assistant messages at the end of the list.")
    if messages[-1].tool_calls:
        raise APIError("Cannot continue an assistant message that contains tool calls.")
    return messages[:-1], _text(messages[-1])
