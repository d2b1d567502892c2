"""A chat request's answers: the whole typed answer (`ChatResult`) or a stream of `ChatChunk`s,
which OpenAI chat completions shape here (`openai_body`, `chat_stream`) and the Anthropic
Messages and Responses adapters shape their own way, without going through OpenAI's JSON.
The request itself (template, grammar, jobs) is built in `serving.py`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from llamaserve.chat.parsed import (
    ContentDelta,
    ParsedMessage,
    ParseEvent,
    ReasoningDelta,
    ToolCall,
    ToolCallArgsDelta,
    ToolCallStart,
)
from llamaserve.chat.tools import new_tool_call_id
from llamaserve.engine.types import Finished, GenerationRequest, TextDelta
from llamaserve.families.chat.protocol import ChatCompletionRequest
from llamaserve.families.chat.serving import ChatJobs, new_completion_id
from llamaserve.families.completions.serving import verbose_body
from llamaserve.serving import generate, logprobs
from llamaserve.serving.generate import Usage, progress_fields
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.sse import DONE, OneStringEvent, data_event


@dataclass(frozen=True)
class ChatChoice:
    """One answer of a chat request, parsed: its tool calls carry their ids."""

    message: ParsedMessage
    finish_reason: str  # OpenAI's: stop | length | tool_calls
    finished: Finished  # the engine's last event: stop type, matched stop word, tokens, timings
    logprobs: dict[str, Any] | None


@dataclass(frozen=True)
class ChatResult:
    """A whole chat answer, for any API family to shape."""

    choices: list[ChatChoice]
    usage: Usage
    timings: dict[str, Any]  # the first choice's, where llama-server puts them
    verbose: dict[str, Any] | None  # `__verbose` when asked: the first choice's native answer
    id: str = ""  # the answer's `chatcmpl-…` id


def _with_ids(parsed: ParsedMessage) -> ParsedMessage:
    """The calls' ids fixed once, so every family that shapes the answer gives the same ones."""
    calls = [ToolCall(c.name, c.arguments, c.id or new_tool_call_id()) for c in parsed.tool_calls]
    return ParsedMessage(content=parsed.content, reasoning=parsed.reasoning, tool_calls=calls)


def _message(parsed: ParsedMessage) -> dict[str, Any]:
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content if (parsed.content or not parsed.tool_calls) else None,
    }
    if parsed.reasoning:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in parsed.tool_calls
        ]
    return msg


def _finish_reason(finished: Finished, parsed: ParsedMessage | None, truncated: bool) -> str:
    if finished.stop_type == "limit" or truncated:
        return "length"
    if parsed is not None and parsed.tool_calls:
        return "tool_calls"
    return "stop"


def _envelope(rt: ModelRuntime, obj: str, completion_id: str) -> dict[str, Any]:
    return {
        "id": completion_id or new_completion_id(),
        "object": obj,
        "created": int(time.time()),
        "model": rt.alias,
        "system_fingerprint": rt.build_info,
    }


def _logprobs(rt: ModelRuntime, job: GenerationRequest, items: list[Any]) -> dict[str, Any] | None:
    return (
        {"content": logprobs.openai_chat(rt.model, items, post=job.post_sampling_probs, special=rt.config.special)}
        if job.n_probs >= 0
        else None
    )


async def chat_result(rt: ModelRuntime, jobs: ChatJobs) -> ChatResult:
    """Run a chat request's choices to the end and parse each answer."""
    results = await generate.complete(rt.engine, jobs.requests)
    out: list[ChatChoice] = []
    for job, r in zip(jobs.requests, results):
        parsed, truncated = jobs.plan.parse(r.text) if jobs.plan.parses else (ParsedMessage(content=r.text), False)
        parsed = _with_ids(parsed)
        reason = _finish_reason(r.done, parsed, truncated)
        out.append(ChatChoice(parsed, reason, r.done, _logprobs(rt, job, r.logprobs)))
    verbose = verbose_body(rt, jobs.requests[0], results[0]) if jobs.verbose else None
    timings = results[0].done.timings.to_json()
    return ChatResult(out, Usage.of([r.done for r in results]), timings, verbose, jobs.id)


def openai_body(rt: ModelRuntime, result: ChatResult) -> dict[str, Any]:
    body = _envelope(rt, "chat.completion", result.id)
    body["choices"] = [
        {"index": i, "message": _message(c.message), "logprobs": c.logprobs, "finish_reason": c.finish_reason}
        for i, c in enumerate(result.choices)
    ]
    body["usage"] = result.usage.openai()
    if result.verbose is not None:
        body["__verbose"] = result.verbose
    body["timings"] = result.timings
    return body


async def chat_complete(rt: ModelRuntime, jobs: ChatJobs) -> dict[str, Any]:
    return openai_body(rt, await chat_result(rt, jobs))


@dataclass
class ChatChunk:
    """One step of a streamed chat answer, in OpenAI's delta vocabulary.

    delta keys: role, content, reasoning_content, tool_calls (OpenAI's shape).
    The final chunk of a choice has finish_reason and timings (and `finished`, the
    engine's last event: its stop type and matched stop word); after all choices finish,
    one chunk with usage, the first choice's timings and index -1 closes the stream. `extra` holds llama-server's
    streaming additions (`prompt_progress`, per-token `timings`), top-level fields
    of the chunk. Other API families (Anthropic Messages, Responses) re-shape these.
    """

    index: int
    delta: dict[str, Any] = field(default_factory=dict)
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    timings: dict[str, Any] | None = None
    usage: Usage | None = None
    finished: Finished | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _deltas(events: list[ParseEvent], ids: dict[int, str]) -> list[dict[str, Any]]:
    """Parser events → OpenAI deltas; a tool call's id, type and name come in its first delta."""
    out: list[dict[str, Any]] = []
    for ev in events:
        if isinstance(ev, ContentDelta):
            if ev.text:
                out.append({"content": ev.text})
        elif isinstance(ev, ReasoningDelta):
            if ev.text:
                out.append({"reasoning_content": ev.text})
        elif isinstance(ev, ToolCallStart):
            ids[ev.index] = ev.id or new_tool_call_id()
            out.append(
                {
                    "tool_calls": [
                        {
                            "index": ev.index,
                            "id": ids[ev.index],
                            "type": "function",
                            "function": {"name": ev.name, "arguments": ""},
                        }
                    ]
                }
            )
        elif isinstance(ev, ToolCallArgsDelta) and ev.text:
            out.append({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]})
    return out


async def chat_chunks(
    rt: ModelRuntime, jobs: ChatJobs, events: AsyncIterator[tuple[int, TextDelta | Finished]]
) -> AsyncIterator[ChatChunk]:
    plan = jobs.plan
    parsers = [plan.stream_parser() if plan.parses else None for _ in jobs.requests]
    call_ids: list[dict[int, str]] = [{} for _ in jobs.requests]
    for i in range(len(jobs.requests)):
        yield ChatChunk(i, {"role": "assistant", "content": None})
    finished: dict[int, Finished] = {}
    async for index, event in events:
        parser = parsers[index]
        if isinstance(event, TextDelta):
            if event.progress is not None:
                yield ChatChunk(index, {}, extra=progress_fields(event))
                continue
            lp = _logprobs(rt, jobs.requests[index], event.logprobs)
            extra = progress_fields(event)
            if parser is None:
                if event.text or event.logprobs:
                    yield ChatChunk(index, {"content": event.text}, lp, extra=extra)
                continue
            deltas = _deltas(parser.feed(event.text), call_ids[index])
            for k, delta in enumerate(deltas):
                yield ChatChunk(index, delta, lp if k == 0 else None, extra=extra if k == 0 else {})
            if not deltas and lp is not None:
                yield ChatChunk(index, {}, lp)
        else:
            finished[index] = event
            truncated = False
            if parser is not None:
                for delta in _deltas(parser.finish(), call_ids[index]):
                    yield ChatChunk(index, delta)
                truncated = bool(getattr(parser, "truncated", False))
            reason = (
                "length" if event.stop_type == "limit" or truncated else ("tool_calls" if call_ids[index] else "stop")
            )
            yield ChatChunk(index, {}, None, reason, event.timings.to_json(), finished=event)
    if finished:
        first = finished[min(finished)]
        yield ChatChunk(-1, usage=Usage.of([finished[i] for i in sorted(finished)]), timings=first.timings.to_json())


def _content_event(envelope: dict[str, Any], index: int) -> OneStringEvent | None:
    """The SSE bytes of choice `index`'s plain content chunk (most of a stream's chunks), built
    around the text; None in the odd case where the envelope itself holds the template's mark."""
    delta = {"content": OneStringEvent.MARK}
    shape = {**envelope, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}]}
    try:
        return OneStringEvent(shape)
    except ValueError:
        return None


async def chat_stream(
    rt: ModelRuntime,
    req: ChatCompletionRequest,
    jobs: ChatJobs,
    events: AsyncIterator[tuple[int, TextDelta | Finished]],
) -> AsyncIterator[bytes]:
    envelope = _envelope(rt, "chat.completion.chunk", jobs.id)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    verbose = jobs.verbose
    texts = ["" for _ in jobs.requests]  # the first choice's text, for __verbose
    content_events: dict[int, OneStringEvent | None] = {}
    async for chunk in chat_chunks(rt, jobs, events):
        index = chunk.index
        if index < 0:
            if include_usage:
                # llama-server puts the timings on the stream's last chunk
                usage = chunk.usage.openai() if chunk.usage is not None else None
                yield data_event({**envelope, "choices": [], "usage": usage, "timings": chunk.timings})
            continue
        delta = chunk.delta
        if verbose:
            texts[index] += str(delta.get("content") or "")
        if (
            len(delta) == 1
            and type(text := delta.get("content")) is str
            and chunk.logprobs is None
            and chunk.finish_reason is None
            and chunk.timings is None
            and not chunk.extra
            and chunk.finished is None
        ):
            if index not in content_events:
                content_events[index] = _content_event(envelope, index)
            template = content_events[index]
            if template is not None:
                yield template.event(text)
                continue
        body = {
            **envelope,
            "choices": [
                {
                    "index": index,
                    "delta": delta,
                    "logprobs": chunk.logprobs,
                    "finish_reason": chunk.finish_reason,
                }
            ],
        }
        if chunk.timings is not None:
            body["timings"] = chunk.timings
        body.update(chunk.extra)
        if verbose and chunk.finished is not None and index == 0:
            done = generate.Completion(text=texts[0], finished=chunk.finished)
            body["__verbose"] = verbose_body(rt, jobs.requests[0], done)
        yield data_event(body)
    yield DONE
