"""`POST /v1/audio/transcriptions`: an audio file answered as a chat about it, as llama-server does.

The form's ``file`` becomes an ``input_audio`` part after the instruction ``prompt``
(default "Transcribe audio to text", `` (language: X)`` appended when ``language`` is
given); the answer is llama-server's ``transcript.text.done`` object, or with
``stream=true`` its ``transcript.text.delta`` events, the done event and ``[DONE]``.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from llamaserve.engine.types import Finished, TextDelta
from llamaserve.errors import APIError
from llamaserve.families.chat import answers
from llamaserve.families.chat import serving as chat
from llamaserve.families.chat.protocol import ChatCompletionRequest
from llamaserve.serving import generate
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.sse import DONE, data_event

DEFAULT_PROMPT = "Transcribe audio to text"
# The form fields read here; any other is ignored, as with unknown JSON fields.
FIELDS = ("model", "language", "prompt", "response_format", "temperature", "stream", "max_tokens")


def _flag(text: str, name: str) -> bool:
    if text not in ("true", "false", "1", "0"):
        raise APIError(f"{name}: expected true or false, got '{text}'")
    return text in ("true", "1")


def transcription_request(
    rt: ModelRuntime, fields: dict[str, str], audio: bytes | None
) -> tuple[ChatCompletionRequest, bool]:
    """The chat request a transcription form stands for, and whether to stream."""
    if rt.media is None or not rt.media.audio:
        raise APIError("The current model does not support audio input.", "not_supported_error")
    if audio is None:
        raise APIError("No input file found for transcription")
    if fields.get("response_format", "json") != "json":
        raise APIError("Only 'json' response_format is supported for transcription")
    prompt = fields.get("prompt") or DEFAULT_PROMPT
    if fields.get("language"):
        prompt += f" (language: {fields['language']})"
    body: dict[str, Any] = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": prompt},
                    {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode()}},
                ],
            }
        ]
    }
    for name, kind in (("temperature", float), ("max_tokens", int)):
        if name in fields:
            try:
                body[name] = kind(fields[name])
            except ValueError:
                raise APIError(f"{name}: not a number: '{fields[name]}'") from None
    if fields.get("model"):
        body["model"] = fields["model"]
    try:
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise APIError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    return req, _flag(fields.get("stream", "false"), "stream")


def _usage(finished: Finished) -> dict[str, Any]:
    return {
        "type": "tokens",
        "input_tokens": finished.n_prompt_tokens,
        "output_tokens": finished.n_predicted,
        "total_tokens": finished.n_prompt_tokens + finished.n_predicted,
        "input_tokens_details": {"cached_tokens": finished.n_cached},
    }


async def transcribe(rt: ModelRuntime, jobs: chat.ChatJobs) -> dict[str, Any]:
    results = await generate.complete(rt.engine, jobs.requests)
    return {"type": "transcript.text.done", "text": results[0].text, "usage": _usage(results[0].done)}


async def transcribe_stream(
    rt: ModelRuntime, jobs: chat.ChatJobs, events: AsyncIterator[tuple[int, TextDelta | Finished]]
) -> AsyncIterator[bytes]:
    text = ""
    async for chunk in answers.chat_chunks(rt, jobs, events):
        delta = chunk.delta.get("content")
        if chunk.index >= 0 and delta:
            text += str(delta)
            yield data_event({"type": "transcript.text.delta", "delta": delta})
        if chunk.finished is not None:
            yield data_event({"type": "transcript.text.done", "text": text, "usage": _usage(chunk.finished)})
    yield DONE
