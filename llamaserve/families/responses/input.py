"""OpenAI Responses requests as chat requests.

The instructions and input items become chat messages (function calls →
assistant tool_calls, their outputs → tool messages, reasoning →
reasoning_content of the next assistant turn), flat function tools become
OpenAI chat tools, text.format becomes response_format. Stored history
(previous_response_id) goes in front of the request's own input.
"""

from __future__ import annotations

from typing import Any

from llamaserve.errors import APIError
from llamaserve.families.chat.protocol import ChatCompletionRequest
from llamaserve.families.responses.protocol import ResponsesRequest
from llamaserve.serving.adapters import build_chat_request, copy_set_fields, forwarded_fields

_OWN_FIELDS = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "text",
    "reasoning",
    "stream",
    "previous_response_id",
    "conversation",
    "background",
    "metadata",
    "temperature",
    "top_p",
    "store",
    "include",
    "truncation",
    "user",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
    "top_logprobs",
    "prompt",
    "max_tool_calls",
    "stream_options",
}

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


# ---------------------------------------------------------------- request
def _part_text(part: Any, where: str) -> str:
    if not isinstance(part, dict):
        raise APIError(f"{where}: a content part must be an object")
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise APIError(f"{where}: a '{kind}' part needs a string 'text'")
        return text
    if kind in ("input_image", "input_file", "input_audio"):
        raise APIError(f"{where}: '{kind}' input is not supported here")
    raise APIError(f"{where}: unsupported content part type '{kind}'")


def _image_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """A Responses ``input_image`` as a chat ``image_url`` part (the chat path loads and checks it)."""
    url = part.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    if not isinstance(url, str) or not url:
        what = "file_id references" if part.get("file_id") else "an input_image without 'image_url'"
        raise APIError(f"{where}: {what} are not supported; send the image as a data URI or URL")
    return {"type": "image_url", "image_url": {"url": url}}


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{where}: expected a string or a list of content parts")
    parts = [
        _image_part(p, f"{where}.{k}")
        if isinstance(p, dict) and p.get("type") == "input_image"
        else {"type": "text", "text": _part_text(p, f"{where}.{k}")}
        for k, p in enumerate(content)
    ]
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return "\n".join(_part_text(p, f"{where}.{k}") for k, p in enumerate(output))
    raise APIError(f"{where}: expected a string or a list of content parts")


def _reasoning_text(item: dict[str, Any]) -> str:
    texts = [c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict)]
    if not any(texts):
        texts = [s.get("text", "") for s in item.get("summary") or [] if isinstance(s, dict)]
    return "\n".join(t for t in texts if isinstance(t, str) and t)


def _input_messages(items: list[dict[str, Any]], n_history: int = 0) -> list[dict[str, Any]]:
    """Items as chat messages; the first n_history come from the stored conversation.

    One pass over history and input together, because a turn can span the
    seam (stored reasoning joins the assistant message that follows it).
    """
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []

    def assistant_turn() -> dict[str, Any]:
        # Function calls join the assistant message just before them (text, then calls).
        last = messages[-1] if messages else None
        if last is None or last["role"] != "assistant":
            last = {"role": "assistant", "content": None}
            messages.append(last)
        if reasoning:
            last["reasoning_content"] = "\n".join(reasoning)
            reasoning.clear()
        return last

    for i, item in enumerate(items):
        where = f"input.{i - n_history}" if i >= n_history else f"previous_response_id item {i}"
        if not isinstance(item, dict):
            raise APIError(f"{where}: an input item must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(f"{where}.role: expected user, assistant, system or developer")
            content = _content(item.get("content", ""), f"{where}.content")
            if role == "assistant":
                text = content if isinstance(content, str) else "\n".join(p["text"] for p in content)
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if reasoning:
                    message["reasoning_content"] = "\n".join(reasoning)
                    reasoning.clear()
                messages.append(message)
            else:
                messages.append({"role": "system" if role == "developer" else role, "content": content})
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not name:
                raise APIError(f"{where}: a function_call item needs a 'name'")
            if not isinstance(call_id, str) or not call_id:
                raise APIError(f"{where}: a function_call item needs a 'call_id'")
            arguments = item.get("arguments", "{}")
            if not isinstance(arguments, str):
                raise APIError(f"{where}.arguments: expected a JSON string")
            turn = assistant_turn()
            turn.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise APIError(f"{where}: a function_call_output item needs a 'call_id'")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": _output_text(item.get("output", ""), f"{where}.output"),
                }
            )
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if text:
                reasoning.append(text)
        elif kind == "item_reference":
            raise APIError(
                f"{where}: item_reference is not supported; send the full items, or continue a "
                "stored response with previous_response_id"
            )
        else:
            raise APIError(f"{where}: input items of type '{kind}' are not supported")
    for m in messages:
        if m["role"] == "assistant" and m.get("content") is None and not m.get("tool_calls"):
            m["content"] = ""
    return messages


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise APIError(f"tools.{i}: tools of type '{kind}' are not supported; only 'function' tools are")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(f"tools.{i}: a function tool needs a 'name'")
        function: dict[str, Any] = {
            "name": name,
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
        }
        if tool.get("description"):
            function["description"] = tool["description"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise APIError("tool_choice: expected 'auto', 'none', 'required' or a function")
        return choice
    kind = choice.get("type")
    if kind == "function":
        name = choice.get("name") or (choice.get("function") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise APIError("tool_choice: a function choice needs a 'name'")
        return {"type": "function", "function": {"name": name}}
    if kind in ("auto", "none", "required"):
        return str(kind)
    raise APIError(f"tool_choice: type '{kind}' is not supported")


def _response_format(text: dict[str, Any]) -> dict[str, Any] | None:
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise APIError("text.format: expected an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if "schema" not in fmt:
            raise APIError("text.format.schema is required for type 'json_schema'")
        spec = {"name": fmt.get("name", "response"), "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            spec["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": spec}
    raise APIError(f"text.format.type: unsupported value '{kind}' (use text, json_object or json_schema)")


def check_supported(req: ResponsesRequest) -> None:
    if req.conversation is not None:
        raise APIError(
            "conversation is not supported (there are no Conversations objects here); continue a "
            "stored response with previous_response_id or send the whole conversation in 'input'"
        )
    if req.background:
        raise APIError("background responses are not supported")


def to_chat_request(req: ResponsesRequest, history: list[dict[str, Any]] | None = None) -> ChatCompletionRequest:
    """The OpenAI chat request equivalent to a Responses request.

    `history` is the stored conversation that previous_response_id names
    (input and output items, oldest first). Only this request's
    instructions apply, as in OpenAI's API: earlier ones are not carried over.
    """
    check_supported(req)
    data = forwarded_fields(req, _OWN_FIELDS)
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    history = history or []
    own = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    messages += _input_messages(history + own, len(history))
    if not messages:
        raise APIError("input: at least one input item is required")
    data.update(model=req.model, messages=messages, n=1, stream=req.stream)
    copy_set_fields(data, req, ("temperature", "top_p"))
    if req.max_output_tokens is not None:
        data["max_tokens"] = req.max_output_tokens
    if req.tools:
        data["tools"] = _tools(req.tools)
    if req.tool_choice is not None:
        data["tool_choice"] = _tool_choice(req.tool_choice)
    if req.parallel_tool_calls is not None:
        data["parallel_tool_calls"] = req.parallel_tool_calls
    if req.text:
        fmt = _response_format(req.text)
        if fmt is not None:
            data["response_format"] = fmt
    effort = (req.reasoning or {}).get("effort")
    if effort is not None:
        data["reasoning_effort"] = effort
        kwargs = dict(data.get("chat_template_kwargs") or {})
        kwargs.setdefault("enable_thinking", effort != "none")
        data["chat_template_kwargs"] = kwargs
    return build_chat_request(data)
