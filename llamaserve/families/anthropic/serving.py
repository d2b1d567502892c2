"""Anthropic Messages over the chat pipeline.

A Messages request becomes the chat pipeline's request (request.py), runs
through answers.chat_result / answers.chat_chunks, and their typed answer (the parsed message,
the engine's stop type and matched stop word, the usage) is shaped here into Anthropic's
message and event stream.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from llamaserve.chat.parsed import ParsedMessage
from llamaserve.engine.types import Finished, TextDelta
from llamaserve.errors import APIError
from llamaserve.families.anthropic.protocol import CountTokensRequest
from llamaserve.families.anthropic.request import to_chat_request
from llamaserve.families.chat import answers
from llamaserve.families.chat import serving as chat
from llamaserve.families.chat.answers import ChatChunk, ChatResult
from llamaserve.families.chat.serving import ChatJobs
from llamaserve.serving.adapters import new_id
from llamaserve.serving.generate import Usage
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.sse import named_event

log = logging.getLogger("llamaserve.messages")

Events = list[tuple[str, dict[str, Any]]]


# ------------------------------------------------------------ shared helpers
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


def thinking_signature(text: str) -> str:
    """Opaque and non-empty, like Anthropic's; clients only store and replay it (ignored on input)."""
    return base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


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


def usage(used: Usage | None) -> dict[str, int]:
    """Anthropic usage: input_tokens excludes the part read from the prompt cache."""
    if used is None:
        used = Usage(0, 0, 0)
    return {
        "input_tokens": used.prompt_tokens - used.cached_tokens,
        "output_tokens": used.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": used.cached_tokens,
    }


def content_blocks(message: ParsedMessage) -> list[dict[str, Any]]:
    """An assistant message as Anthropic content blocks: thinking, text, tool_use."""
    blocks: list[dict[str, Any]] = []
    if message.reasoning:
        blocks.append(
            {"type": "thinking", "thinking": message.reasoning, "signature": thinking_signature(message.reasoning)}
        )
    if message.content or not message.tool_calls:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": parse_arguments(call.arguments)})
    return blocks


def message_body(model: str, result: ChatResult, stops: list[str] | None, msg_id: str | None = None) -> dict[str, Any]:
    choice = result.choices[0]
    blocks = content_blocks(choice.message)
    reason, sequence = stop_reason(choice.finish_reason, choice.finished, stops, bool(choice.message.tool_calls))
    return {
        "id": msg_id or new_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(result.usage),
    }


async def create_message(rt: ModelRuntime, req: CountTokensRequest, jobs: ChatJobs) -> dict[str, Any]:
    return message_body(rt.alias, await answers.chat_result(rt, jobs), req.stop_sequences)


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

    def feed(self, chunk: ChatChunk) -> Events:
        if self.done:
            return []
        if chunk.index < 0:
            return self.finish(chunk.usage)
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
            self.finished = chunk.finished
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

    def finish(self, used: Usage | None) -> Events:
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
                    "usage": usage(used),
                },
            )
        )
        out.append(("message_stop", {"type": "message_stop"}))
        return out


async def message_events(
    stream: MessageStream, chunks: AsyncIterator[ChatChunk]
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    for event in stream.start():
        yield event
    async for chunk in chunks:
        for event in stream.feed(chunk):
            yield event
    for event in stream.finish(None):
        yield event


async def message_stream(
    rt: ModelRuntime,
    req: CountTokensRequest,
    jobs: ChatJobs,
    events: AsyncIterator[tuple[int, TextDelta | Finished]],
) -> AsyncIterator[bytes]:
    stream = MessageStream(rt.alias, len(jobs.requests[0].prompt_tokens), req.stop_sequences)
    async for name, data in message_events(stream, answers.chat_chunks(rt, jobs, events)):
        yield named_event(name, data)


def error_event(exc: APIError) -> bytes:
    return named_event("error", exc.anthropic_body())
