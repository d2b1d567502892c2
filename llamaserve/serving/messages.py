"""Anthropic Messages over the chat pipeline.

A Messages request becomes an OpenAI ChatCompletionRequest (system → system
message, tool_use/tool_result blocks → tool_calls and tool messages, tools in
function shape, thinking → template kwargs), runs through chat.chat_request
and chat.chat_complete / chat.chat_chunks, and the OpenAI-shaped result is
re-shaped into Anthropic's message and event stream.

`FinishTap` and the helpers around it are shared with the Responses adapter:
they recover the engine's stop type (a matched stop string) that the
OpenAI-shaped results do not carry.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

from pydantic import BaseModel, ValidationError

from llamaserve.engine.client import EngineClient
from llamaserve.engine.types import Event, Finished, GenerationRequest, TextDelta
from llamaserve.errors import APIError, validation_message
from llamaserve.protocol.anthropic import AnthropicMessage, AnthropicTool, CountTokensRequest, ToolChoice
from llamaserve.protocol.common import SamplingFields
from llamaserve.protocol.openai import ChatCompletionRequest
from llamaserve.serving import chat
from llamaserve.serving.chat import ChatChunk
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.sse import named_event

log = logging.getLogger("llamaserve.messages")

Events = list[tuple[str, dict[str, Any]]]


# ------------------------------------------------------------ shared helpers
class FinishTap:
    """An engine client that remembers each choice's Finished event.

    chat_complete / chat_chunks report finish_reason only ("stop" or
    "length"); Anthropic's stop_sequence needs the matched stop string.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.finished: dict[int, Finished] = {}

    async def generate_choices(self, jobs: list[GenerationRequest]) -> AsyncIterator[tuple[int, Event]]:
        async for index, event in self.engine.generate_choices(jobs):
            if isinstance(event, Finished):
                self.finished[index] = event
            yield index, event

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def runtime(self, rt: ModelRuntime) -> ModelRuntime:
        """rt with this tap as its engine, for functions that take a runtime."""
        # Duck-typed: generate_choices is ours, everything else is the wrapped client's.
        return dataclasses.replace(rt, engine=cast(EngineClient, self))


async def tapped(
    events: AsyncIterator[tuple[int, TextDelta | Finished]], tap: FinishTap
) -> AsyncIterator[tuple[int, TextDelta | Finished]]:
    """Pass engine events through, remembering Finished ones in tap."""
    async for index, event in events:
        if isinstance(event, Finished):
            tap.finished[index] = event
        yield index, event


def forwarded_fields(req: BaseModel, own: set[str]) -> dict[str, Any]:
    """llama.cpp knobs and unknown extras the client set, minus the fields this API defines itself."""
    sampling = set(SamplingFields.model_fields)
    out = {k: v for k, v in req.model_dump(exclude_unset=True).items() if k in sampling and k not in own}
    for k, v in (req.model_extra or {}).items():
        if k not in own:
            out[k] = v
    return out


def build_chat_request(data: dict[str, Any]) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise APIError(validation_message(exc)) from None


def count_prompt_tokens(rt: ModelRuntime, req: ChatCompletionRequest) -> int:
    """The prompt a chat request would run, rendered and tokenized (no context-size check)."""
    return chat.count_prompt_tokens(rt, req)


def parse_arguments(arguments: Any) -> dict[str, Any]:
    """Tool-call arguments (a JSON object as text) as a dict."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        log.warning("tool call arguments are not JSON: %.200r", arguments)
        return {}
    return value if isinstance(value, dict) else {"value": value}


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def thinking_signature(text: str) -> str:
    """Opaque and non-empty, like Anthropic's; clients only store and replay it (ignored on input)."""
    return base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


# ---------------------------------------------------------------- request
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
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(req, name)
        if value is not None:
            data[name] = value
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


# --------------------------------------------------------------- response
def stop_reason(
    finish_reason: str | None, finished: Finished | None, stops: list[str] | None, called_tools: bool
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). Truncation wins over a half-written tool call."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "tool_calls" or called_tools:
        return "tool_use", None
    if finished is not None and finished.stop_type == "word" and stops and finished.stopping_word in stops:
        return "stop_sequence", finished.stopping_word
    return "end_turn", None


def usage(oai: dict[str, Any]) -> dict[str, int]:
    """Anthropic usage: input_tokens excludes the part read from the prompt cache."""
    prompt = int(oai.get("prompt_tokens", 0))
    cached = int((oai.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    return {
        "input_tokens": prompt - cached,
        "output_tokens": int(oai.get("completion_tokens", 0)),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """An OpenAI assistant message as Anthropic content blocks: thinking, text, tool_use."""
    blocks: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": thinking_signature(reasoning)})
    text = message.get("content")
    calls = message.get("tool_calls") or []
    if text or not calls:
        blocks.append({"type": "text", "text": text or ""})
    for call in calls:
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id") or new_id("toolu_"),
                "name": function.get("name", ""),
                "input": parse_arguments(function.get("arguments")),
            }
        )
    return blocks


def message_body(
    model: str, chat_body: dict[str, Any], finished: Finished | None, stops: list[str] | None, msg_id: str | None = None
) -> dict[str, Any]:
    choice = chat_body["choices"][0]
    message = choice.get("message") or {}
    blocks = content_blocks(message)
    reason, sequence = stop_reason(
        choice.get("finish_reason"), finished, stops, any(b["type"] == "tool_use" for b in blocks)
    )
    return {
        "id": msg_id or new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(chat_body.get("usage") or {}),
    }


async def create_message(
    rt: ModelRuntime, req: CountTokensRequest, jobs: list[GenerationRequest], tap: FinishTap
) -> dict[str, Any]:
    body = await chat.chat_complete(tap.runtime(rt), jobs)
    return message_body(rt.alias, body, tap.finished.get(0), req.stop_sequences)


async def count_tokens(rt: ModelRuntime, req: CountTokensRequest) -> dict[str, int]:
    return {"input_tokens": await chat.count_tokens_with_media(rt, to_chat_request(req))}


# -------------------------------------------------------------- streaming
class MessageStream:
    """ChatChunks (OpenAI delta vocabulary) → Anthropic stream events.

    One content block is open at a time; a change of kind (thinking, text, a
    new tool call) closes it and opens the next, so each block gets exactly
    one content_block_start and one content_block_stop, and every delta goes
    to a block of its own kind.
    """

    def __init__(
        self, model: str, input_tokens: int, stops: list[str] | None = None, msg_id: str | None = None
    ) -> None:
        self.id = msg_id or new_id("msg_")
        self.model = model
        self.input_tokens = input_tokens
        self.stops = stops
        self.blocks: list[dict[str, Any]] = []  # what the finished message holds
        self.open: int | None = None
        self.tool_blocks: dict[int, int] = {}  # tool-call index → block index
        self.tool_json: dict[int, str] = {}  # block index → the arguments text so far
        self.finish_reason: str | None = None
        self.finished: Finished | None = None
        self.done = False

    # events
    def start(self) -> Events:
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.input_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def _open(self, block: dict[str, Any]) -> Events:
        out = self._close()
        self.blocks.append(block)
        self.open = len(self.blocks) - 1
        out.append(
            ("content_block_start", {"type": "content_block_start", "index": self.open, "content_block": dict(block)})
        )
        return out

    def _close(self) -> Events:
        if self.open is None:
            return []
        index, self.open = self.open, None
        block = self.blocks[index]
        out: Events = []
        if block["type"] == "thinking":
            block["signature"] = thinking_signature(block["thinking"])
            out.append(self._delta(index, {"type": "signature_delta", "signature": block["signature"]}))
        if block["type"] == "tool_use":
            block["input"] = parse_arguments(self.tool_json.get(index, ""))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        return out

    @staticmethod
    def _delta(index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}

    def _kind_open(self, kind: str) -> bool:
        return self.open is not None and self.blocks[self.open]["type"] == kind

    def feed(self, chunk: ChatChunk, finished: Finished | None = None) -> Events:
        if self.done:
            return []
        if chunk.index < 0:
            return self.finish(chunk.usage or {})
        if chunk.index != 0:
            return []  # Messages has one choice
        out: Events = []
        delta = chunk.delta
        reasoning = delta.get("reasoning_content")
        if reasoning:
            if not self._kind_open("thinking"):
                out += self._open({"type": "thinking", "thinking": "", "signature": ""})
            assert self.open is not None
            self.blocks[self.open]["thinking"] += reasoning
            out.append(self._delta(self.open, {"type": "thinking_delta", "thinking": reasoning}))
        text = delta.get("content")
        if text:
            if not self._kind_open("text"):
                out += self._open({"type": "text", "text": ""})
            assert self.open is not None
            self.blocks[self.open]["text"] += text
            out.append(self._delta(self.open, {"type": "text_delta", "text": text}))
        for call in delta.get("tool_calls") or []:
            out += self._tool_delta(call)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            self.finished = finished
            out += self._close()
            if not self.blocks:
                # An empty answer is still one (empty) text block, as in the non-streamed message.
                out += self._open({"type": "text", "text": ""})
                out += self._close()
        return out

    def _tool_delta(self, call: dict[str, Any]) -> Events:
        out: Events = []
        position = int(call.get("index", 0))
        function = call.get("function") or {}
        if position not in self.tool_blocks:
            out += self._open(
                {
                    "type": "tool_use",
                    "id": call.get("id") or new_id("toolu_"),
                    "name": function.get("name") or "",
                    "input": {},
                }
            )
            assert self.open is not None
            self.tool_blocks[position] = self.open
        index = self.tool_blocks[position]
        fragment = function.get("arguments")
        if fragment:
            self.tool_json[index] = self.tool_json.get(index, "") + fragment
            out.append(self._delta(index, {"type": "input_json_delta", "partial_json": fragment}))
        return out

    def finish(self, oai_usage: dict[str, Any]) -> Events:
        """message_delta (stop reason, cumulative usage) and message_stop."""
        if self.done:
            return []
        out = self._close()
        self.done = True
        reason, sequence = stop_reason(
            self.finish_reason, self.finished, self.stops, any(b["type"] == "tool_use" for b in self.blocks)
        )
        out.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": usage(oai_usage),
                },
            )
        )
        out.append(("message_stop", {"type": "message_stop"}))
        return out


async def message_events(
    stream: MessageStream, chunks: AsyncIterator[ChatChunk], tap: FinishTap | None = None
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    for event in stream.start():
        yield event
    async for chunk in chunks:
        finished = tap.finished.get(chunk.index) if tap is not None else None
        for event in stream.feed(chunk, finished):
            yield event
    for event in stream.finish({}):
        yield event


async def message_stream(
    rt: ModelRuntime,
    req: CountTokensRequest,
    jobs: list[GenerationRequest],
    tap: FinishTap,
    events: AsyncIterator[tuple[int, TextDelta | Finished]],
) -> AsyncIterator[bytes]:
    stream = MessageStream(rt.alias, len(jobs[0].prompt_tokens), req.stop_sequences)
    chunks = chat.chat_chunks(rt, jobs, tapped(events, tap))
    async for name, data in message_events(stream, chunks, tap):
        yield named_event(name, data)


def error_event(exc: APIError) -> bytes:
    return named_event("error", exc.anthropic_body())
