"""The variables a chat template sees besides the messages: llama-server's template kwargs.

The server's defaults come from `--chat-template-kwargs` and the reasoning flags
(`--reasoning on|off`, `--reasoning-effort`, `--reasoning-preserve`), a request's
`chat_template_kwargs` go on top, and the names llama.cpp derives from them
(`reasoning_strength`, `preserve_thinking`, ...) are filled in last, so a template
written for any of the spellings reads the same setting.
"""

from __future__ import annotations

from typing import Any

from llamaserve.config import ServerConfig


def server_template_kwargs(config: ServerConfig, base: dict[str, Any]) -> dict[str, Any]:
    """`--chat-template-kwargs` (``base``) with the reasoning flags applied on top.

    llama-server writes these flags into the same map as `--chat-template-kwargs`, the
    later flag winning; here the dedicated flag wins, whatever the order on the line.
    """
    kwargs = dict(base)
    if config.reasoning == "on":
        kwargs["enable_thinking"] = True
    elif config.reasoning == "off":
        kwargs["enable_thinking"] = False
    if config.reasoning_effort != "default":
        kwargs["reasoning_effort"] = config.reasoning_effort
    if config.reasoning_preserve is not None:
        # Only when given: otherwise the template's own default holds, as in llama-server.
        kwargs["preserve_reasoning"] = config.reasoning_preserve
    return kwargs


def render_kwargs(
    server: dict[str, Any],
    request: dict[str, Any] | None,
    *,
    thinking_default: bool,
    reasoning_effort: str | None = None,
) -> dict[str, Any]:
    """What the template is rendered with: the server's kwargs, the request's over them.

    ``reasoning_effort`` is the request field (OpenAI's): it replaces any kwarg of that name,
    and ``none`` removes it and turns thinking off unless a kwarg says otherwise, as in
    llama-server. ``thinking_default`` is llama-server's ``enable_thinking`` context value
    when no kwarg names it: on for templates that support thinking unless `--reasoning off`.
    """
    kwargs = {**server, **(request or {})}
    if reasoning_effort == "none":
        kwargs.pop("reasoning_effort", None)
        kwargs.setdefault("enable_thinking", False)
    elif reasoning_effort:
        kwargs["reasoning_effort"] = reasoning_effort
    kwargs.setdefault("enable_thinking", thinking_default)
    preserve = kwargs.get("preserve_reasoning")
    if isinstance(preserve, bool):
        # llama.cpp's caps_apply_preserve_reasoning: the names templates use for it.
        for name, value in (
            ("preserve_thinking", preserve),
            ("clear_thinking", not preserve),
            ("truncate_history_thinking", not preserve),
            ("drop_thinking", not preserve),
        ):
            kwargs.setdefault(name, value)
    effort = kwargs.get("reasoning_effort")
    if isinstance(effort, str) and effort:
        kwargs.setdefault("reasoning_strength", effort)  # llama.cpp's caps_apply_reasoning_effort
    return kwargs
