"""OpenAI Responses over the chat pipeline: the answer side.

The request becomes a chat request in families/responses/input.py. The chat
pipeline's typed answer (`ChatResult`, or its `ChatChunk`s) is shaped here into a
Response object or the Responses event stream (sequence_number on every event).

A request that continues a stored response (previous_response_id) gets
the stored conversation as `history` items in front of its own input; the
store itself and the lookups live in state.py.
conversation and background are refused with a 400.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from llamaserve.chat.parsed import ParsedMessage
from llamaserve.engine.types import Finished, TextDelta
from llamaserve.errors import APIError
from llamaserve.families.chat import answers
from llamaserve.families.chat import serving as chat
from llamaserve.families.chat.answers import ChatChunk
from llamaserve.families.chat.serving import ChatJobs
from llamaserve.families.responses.input import to_chat_request
from llamaserve.families.responses.protocol import ResponsesRequest
from llamaserve.serving.adapters import new_id
from llamaserve.serving.generate import Usage
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.sse import named_event

Events = list[tuple[str, dict[str, Any]]]
TokenCounter = Callable[[str], int]


# --------------------------------------------------------------- response
def usage(used: Usage | None, reasoning_tokens: int = 0) -> dict[str, Any]:
    if used is None:
        used = Usage(0, 0, 0)
    prompt, completion = used.prompt_tokens, used.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": used.cached_tokens},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, completion)},
        "total_tokens": prompt + completion,
    }


def envelope(
    model: str, req: ResponsesRequest, resp_id: str | None = None, created_at: int | None = None
) -> dict[str, Any]:
    """The Response object without its outcome (status, output, usage)."""
    fmt = (req.text or {}).get("format") or {"type": "text"}
    reasoning = req.reasoning or {}
    return {
        "id": resp_id or new_id("resp_"),
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": req.store,  # turned False by response_state when the write fails
        "temperature": req.temperature,
        "text": {"format": fmt},
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto",
        "tools": req.tools or [],
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": None,
        "metadata": req.metadata or {},
    }


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [_text_part(text)]}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def finish(
    body: dict[str, Any],
    output: list[dict[str, Any]],
    finish_reason: str | None,
    used: Usage | None,
    reasoning_tokens: int = 0,
) -> dict[str, Any]:
    """body completed with its outcome; truncation makes it 'incomplete'."""
    incomplete = finish_reason == "length"
    body = dict(body)
    body.update(
        status="incomplete" if incomplete else "completed",
        output=output,
        incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
        usage=usage(used, reasoning_tokens),
    )
    body["output_text"] = "".join(
        part["text"]
        for item in output
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
    return body


def output_items(message: ParsedMessage, finish_reason: str | None) -> list[dict[str, Any]]:
    """An assistant message as Responses output items: reasoning, message, function calls."""
    items: list[dict[str, Any]] = []
    last_status = "incomplete" if finish_reason == "length" else "completed"
    if message.reasoning:
        items.append(_reasoning_item(new_id("rs_"), message.reasoning, "completed"))
    if message.content or not message.tool_calls:
        items.append(_message_item(new_id("msg_"), message.content, "completed"))
    for call in message.tool_calls:
        items.append(_call_item(new_id("fc_"), call.id, call.name, call.arguments, "completed"))
    if items:
        items[-1]["status"] = last_status
    return items


def _token_counter(rt: ModelRuntime) -> TokenCounter:
    def count(text: str) -> int:
        return len(rt.model.tokenize(text, add_special=False, parse_special=False)) if text else 0

    return count


async def create_response(rt: ModelRuntime, req: ResponsesRequest, jobs: ChatJobs) -> dict[str, Any]:
    result = await answers.chat_result(rt, jobs)
    choice = result.choices[0]
    reasoning_tokens = _token_counter(rt)(choice.message.reasoning)
    return finish(
        envelope(rt.alias, req),
        output_items(choice.message, choice.finish_reason),
        choice.finish_reason,
        result.usage,
        reasoning_tokens,
    )


def input_tokens(
    rt: ModelRuntime, req: ResponsesRequest, history: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    n_tokens = chat.count_prompt_tokens(rt, to_chat_request(req, history))
    return {"object": "response.input_tokens", "input_tokens": n_tokens}


# -------------------------------------------------------------- streaming
class ResponseStream:
    """ChatChunks (OpenAI delta vocabulary) → Responses stream events.

    One output item is open at a time: reasoning (one reasoning_text part),
    message (one output_text part) or function_call. Every event carries the
    next sequence_number; the last one is response.completed, or
    response.incomplete when generation hit max_output_tokens.
    """

    def __init__(self, body: dict[str, Any], count_tokens: TokenCounter | None = None) -> None:
        self.body = body
        self.count_tokens = count_tokens or (lambda text: 0)
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.open: int | None = None
        self.calls: dict[int, int] = {}  # tool-call index → output index
        self.finish_reason: str | None = None
        self.done = False

    def _event(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return kind, event

    def start(self) -> Events:
        return [
            self._event("response.created", response=dict(self.body)),
            self._event("response.in_progress", response=dict(self.body)),
        ]

    def _open(self, item: dict[str, Any]) -> Events:
        out = self._close()
        self.output.append(item)
        self.open = len(self.output) - 1
        added = {**item, "status": "in_progress"}
        if item["type"] in ("message", "reasoning"):
            added["content"] = []
        out.append(self._event("response.output_item.added", output_index=self.open, item=added))
        if item["type"] == "message":
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self.open,
                    content_index=0,
                    part=_text_part(""),
                )
            )
        elif item["type"] == "reasoning":
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self.open,
                    content_index=0,
                    part={"type": "reasoning_text", "text": ""},
                )
            )
        return out

    def _close(self, status: str = "completed") -> Events:
        if self.open is None:
            return []
        index, self.open = self.open, None
        item = self.output[index]
        item["status"] = status
        out: Events = []
        if item["type"] == "message":
            part = item["content"][0]
            out.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=dict(part),
                )
            )
        elif item["type"] == "reasoning":
            part = item["content"][0]
            out.append(
                self._event(
                    "response.reasoning_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=part["text"],
                )
            )
            out.append(
                self._event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=dict(part),
                )
            )
        else:
            out.append(
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            )
        out.append(
            self._event(
                "response.output_item.done",
                output_index=index,
                item={**item, "content": [dict(p) for p in item["content"]]} if "content" in item else dict(item),
            )
        )
        return out

    def _kind_open(self, kind: str) -> bool:
        return self.open is not None and self.output[self.open]["type"] == kind

    def feed(self, chunk: ChatChunk) -> Events:
        if self.done:
            return []
        if chunk.index < 0:
            return self.finish(chunk.usage)
        if chunk.index != 0:
            return []
        out: Events = []
        delta = chunk.delta
        reasoning = delta.get("reasoning_content")
        if reasoning:
            if not self._kind_open("reasoning"):
                out += self._open(_reasoning_item(new_id("rs_"), "", "in_progress"))
            assert self.open is not None
            item = self.output[self.open]
            item["content"][0]["text"] += reasoning
            out.append(
                self._event(
                    "response.reasoning_text.delta",
                    item_id=item["id"],
                    output_index=self.open,
                    content_index=0,
                    delta=reasoning,
                )
            )
        text = delta.get("content")
        if text:
            if not self._kind_open("message"):
                out += self._open(_message_item(new_id("msg_"), "", "in_progress"))
            assert self.open is not None
            item = self.output[self.open]
            item["content"][0]["text"] += text
            out.append(
                self._event(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=self.open,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        for call in delta.get("tool_calls") or []:
            out += self._call_delta(call)
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            if not self.output:
                out += self._open(_message_item(new_id("msg_"), "", "in_progress"))
            out += self._close("incomplete" if chunk.finish_reason == "length" else "completed")
        return out

    def _call_delta(self, call: dict[str, Any]) -> Events:
        out: Events = []
        position = int(call.get("index", 0))
        function = call.get("function") or {}
        if position not in self.calls:
            out += self._open(
                _call_item(
                    new_id("fc_"), call.get("id") or new_id("call_"), function.get("name") or "", "", "in_progress"
                )
            )
            assert self.open is not None
            self.calls[position] = self.open
        index = self.calls[position]
        fragment = function.get("arguments")
        if fragment:
            item = self.output[index]
            item["arguments"] += fragment
            out.append(
                self._event(
                    "response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=fragment
                )
            )
        return out

    def finish(self, used: Usage | None) -> Events:
        if self.done:
            return []
        out = self._close("incomplete" if self.finish_reason == "length" else "completed")
        self.done = True
        reasoning = "".join(item["content"][0]["text"] for item in self.output if item["type"] == "reasoning")
        final = finish(self.body, self.output, self.finish_reason, used, self.count_tokens(reasoning))
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, response=final))
        return out

    def fail(self, exc: APIError) -> Events:
        """A failure after the stream began: an error event, then response.failed."""
        if self.done:
            return []
        self.done = True
        code = "server_error" if exc.status >= 500 else exc.kind
        failed = dict(self.body)
        failed.update(status="failed", output=self.output, error={"code": code, "message": exc.message})
        return [
            self._event("error", code=code, message=exc.message, param=None),
            self._event("response.failed", response=failed),
        ]


async def response_events(
    stream: ResponseStream, chunks: AsyncIterator[ChatChunk]
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    for event in stream.start():
        yield event
    try:
        async for chunk in chunks:
            for event in stream.feed(chunk):
                yield event
    except APIError as exc:
        for event in stream.fail(exc):
            yield event
        return
    for event in stream.finish(None):
        yield event


FinalHook = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def response_stream(
    rt: ModelRuntime,
    req: ResponsesRequest,
    jobs: ChatJobs,
    events: AsyncIterator[tuple[int, TextDelta | Finished]],
    on_final: FinalHook | None = None,
) -> AsyncIterator[bytes]:
    """The SSE stream. `on_final` sees the finished Response before its event is sent.

    It runs before the last event so a client that reads the stream to its
    end and then retrieves the response always finds it stored.
    """
    stream = ResponseStream(envelope(rt.alias, req), _token_counter(rt))
    async for name, data in response_events(stream, answers.chat_chunks(rt, jobs, events)):
        if on_final is not None and name in ("response.completed", "response.incomplete"):
            data = {**data, "response": await on_final(data["response"])}
        yield named_event(name, data)
