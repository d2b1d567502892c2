"""An Anthropic Messages request as the OpenAI chat request the pipeline runs: system → system
message, tool_use/tool_result blocks → tool_calls and tool messages, tools in function shape,
thinking → template kwargs, output_config → response_format. Every malformed block is a 400
naming where it is."""

from __future__ import annotations

import json
from typing import Any

from llamaserve.errors import APIError
from llamaserve.families.anthropic.protocol import AnthropicMessage, AnthropicTool, CountTokensRequest, ToolChoice
from llamaserve.families.chat.protocol import ChatCompletionRequest
from llamaserve.serving.adapters import build_chat_request, copy_set_fields, forwarded_fields, new_id

# Fields of the Anthropic request that are translated, not forwarded as they are.
_OWN_FIELDS = {
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "max_tokens",
    "stop_sequences",
    "metadata",
    "output_config",
    "stream",
    "top_k",
    "top_p",
    "temperature",
}


def _where(*path: Any) -> str:
    return ".".join(str(p) for p in path)


def _text_of(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise APIError(f"{where}: a text block needs a string 'text'")
    return text


def _unsupported_media(kind: str, where: str) -> APIError:
    if kind == "image":
        return APIError(
            f"{where}: image input is not supported: the loaded model has no vision projector "
            "(llama-server needs --mmproj for images)"
        )
    return APIError(f"{where}: content blocks of type '{kind}' are not supported")


def _joined(parts: list[str]) -> str | list[dict[str, Any]]:
    # One part stays a string; several go to the template as text parts, which
    # it joins the way llama-server does.
    if len(parts) == 1:
        return parts[0]
    return [{"type": "text", "text": p} for p in parts]


def _system(system: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if isinstance(system, str):
        return system
    parts = []
    for j, block in enumerate(system):
        if block.get("type") != "text":
            raise APIError(f"system.{j}: only text blocks are allowed in system")
        parts.append(_text_of(block, _where("system", j)))
    return _joined(parts) if parts else ""


def _tool_result_content(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{where}.content: expected a string or a list of blocks")
    texts = []
    for k, inner in enumerate(content):
        if not isinstance(inner, dict):
            raise APIError(f"{where}.content.{k}: expected a content block")
        kind = inner.get("type")
        if kind != "text":
            raise _unsupported_media(str(kind), f"{where}.content.{k}")
        texts.append(_text_of(inner, f"{where}.content.{k}"))
    return "\n".join(texts)


def _user_message(content: str | list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_messages: list[dict[str, Any]] = []
    texts: list[str] = []
    parts: list[dict[str, Any]] = []  # text and images in order, once an image is seen
    for j, block in enumerate(content):
        where = _where("messages", i, "content", j)
        kind = block["type"]
        if kind == "text":
            texts.append(_text_of(block, where))
            parts.append({"type": "text", "text": texts[-1]})
        elif kind == "image":
            parts.append(_image_part(block, where))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise APIError(f"{where}: a tool_result block needs 'tool_use_id'")
            tool_messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _tool_result_content(block, where)}
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise _unsupported_media(kind, where)
    # Tool results answer the previous assistant turn, so they come first.
    out = tool_messages
    if len(parts) > len(texts):  # images: the parts go on as OpenAI content parts
        out.append({"role": "user", "content": parts})
    elif texts or not tool_messages:
        out.append({"role": "user", "content": _joined(texts) if texts else ""})
    return out


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An Anthropic image block as an OpenAI image_url part (base64 → a data URI)."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise APIError(f"{where}: an image block needs a 'source'")
    if source.get("type") == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        if not isinstance(media_type, str) or not media_type.startswith("image/") or not isinstance(data, str):
            raise APIError(f"{where}: a base64 image source needs an image/* 'media_type' and 'data'")
        return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{data}"}}
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise APIError(f"{where}: image source type must be 'base64' or 'url'")


def _assistant_message(content: str | list[dict[str, Any]], i: int) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = _where("messages", i, "content", j)
        kind = block["type"]
        if kind == "text":
            texts.append(_text_of(block, where))
        elif kind == "thinking":
            thought = block.get("thinking")
            if isinstance(thought, str) and thought:
                reasoning.append(thought)
        elif kind == "redacted_thinking":
            continue  # encrypted by another provider; nothing a local model can read
        elif kind == "tool_use":
            name = block.get("name")
            if not isinstance(name, str) or not name:
                raise APIError(f"{where}: a tool_use block needs a 'name'")
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise APIError(f"{where}.input: expected an object")
            calls.append(
                {
                    "id": str(block.get("id") or new_id("toolu_")),
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
                }
            )
        else:
            raise _unsupported_media(kind, where)
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    return message


def _messages(messages: list[AnthropicMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if m.role == "user":
            out.extend(_user_message(m.content, i))
        else:
            out.append(_assistant_message(m.content, i))
    return out


def _tools(tools: list[AnthropicTool]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise APIError(
                f"tools.{i}: server tools ('{tool.type}') are not supported; "
                "define client tools with name, description and input_schema"
            )
        function: dict[str, Any] = {
            "name": tool.name,
            "parameters": tool.input_schema or {"type": "object", "properties": {}},
        }
        if tool.description:
            function["description"] = tool.description
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: ToolChoice, has_tools: bool) -> tuple[str | dict[str, Any], bool | None]:
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "auto":
        return "auto", parallel
    if choice.type == "none":
        return "none", parallel
    if not has_tools:
        raise APIError(f"tool_choice: type '{choice.type}' requires tools")
    if choice.type == "any":
        return "required", parallel
    if not choice.name:
        raise APIError("tool_choice: type 'tool' requires a 'name'")
    return {"type": "function", "function": {"name": choice.name}}, parallel


def to_chat_request(req: CountTokensRequest) -> ChatCompletionRequest:
    """The OpenAI chat request equivalent to an Anthropic Messages request."""
    data = forwarded_fields(req, _OWN_FIELDS)
    messages = _messages(req.messages)
    if req.system:
        messages.insert(0, {"role": "system", "content": _system(req.system)})
    data.update(model=req.model, messages=messages, n=1, stream=req.stream)
    copy_set_fields(data, req, ("temperature", "top_p", "top_k"))
    if req.max_tokens is not None:
        data["max_tokens"] = req.max_tokens
    if req.stop_sequences:
        data["stop"] = list(req.stop_sequences)
    if req.tools:
        data["tools"] = _tools(req.tools)
    if req.tool_choice is not None:
        choice, parallel = _tool_choice(req.tool_choice, bool(req.tools))
        data["tool_choice"] = choice
        if parallel is not None:
            data["parallel_tool_calls"] = parallel
    if req.thinking is not None:
        kwargs = dict(data.get("chat_template_kwargs") or {})
        kwargs.setdefault("enable_thinking", req.thinking.type != "disabled")
        data["chat_template_kwargs"] = kwargs
        if req.thinking.type == "enabled" and req.thinking.budget_tokens is not None:
            data.setdefault("reasoning_budget_tokens", req.thinking.budget_tokens)
    if req.output_config is not None:
        fmt = req.output_config.format
        if fmt is not None:
            if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
                raise APIError('output_config.format: expected {"type": "json_schema", "schema": {...}}')
            data["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": fmt["schema"]},
            }
        if req.output_config.effort is not None:
            data.setdefault("reasoning_effort", req.output_config.effort)
    return build_chat_request(data)
