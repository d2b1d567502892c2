"""OpenAI chat routes: /v1/chat/completions, its input-token count, and audio transcriptions
(which run through the chat pipeline)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from llamaserve.api.http import JSONUTF8Response, read_body, read_json, runtime_of, stream_events, with_usage
from llamaserve.api.sse import until_disconnect
from llamaserve.errors import APIError
from llamaserve.families.chat import answers, control, transcriptions
from llamaserve.families.chat import serving as chat
from llamaserve.families.chat.protocol import ChatCompletionRequest, ChatControlRequest
from llamaserve.serving import generate
from llamaserve.serving.state import ServerState


def chat_routes(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    @router.post("/chat/completions")
    async def chat_completions(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, ChatCompletionRequest)
        jobs = await chat.chat_request(rt, req)
        if req.stream:
            events = generate.stream(rt.engine, jobs.requests)
            return await stream_events(
                request, events, lambda ev: answers.chat_stream(rt, req, jobs, ev), ping_interval=req.sse_ping_interval
            )
        return with_usage(request, await until_disconnect(request, answers.chat_complete(rt, jobs)))

    @router.post("/v1/chat/completions/control")
    async def chat_completions_control(request: Request) -> Response:
        """End a running answer's reasoning (`reasoning_end`), as llama-server's route does."""
        req = await read_json(request, ChatControlRequest)
        if state.asleep is not None:
            return JSONUTF8Response(control.asleep_answer(req))
        return JSONUTF8Response(await control.control(runtime_of(state), req))

    @router.post("/v1/chat/completions/input_tokens")
    @router.post("/chat/completions/input_tokens")
    async def chat_input_tokens(request: Request) -> Response:
        """The prompt a chat request would run, counted (llama-server's token-counting route)."""
        rt = runtime_of(state)
        req = await read_json(request, ChatCompletionRequest)
        n = await chat.count_tokens_with_media(rt, req)
        return JSONUTF8Response({"input_tokens": n, "object": "response.input_tokens"})

    @router.post("/v1/audio/transcriptions")
    @router.post("/audio/transcriptions")
    async def audio_transcriptions(request: Request) -> Response:
        rt = runtime_of(state)
        fields, audio = await _read_form(request)
        req, stream = transcriptions.transcription_request(rt, fields, audio)
        jobs = await chat.chat_request(rt, req)
        if stream:
            events = generate.stream(rt.engine, jobs.requests)
            return await stream_events(request, events, lambda ev: transcriptions.transcribe_stream(rt, jobs, ev))
        return JSONUTF8Response(await until_disconnect(request, transcriptions.transcribe(rt, jobs)))

    return router


async def _read_form(request: Request) -> tuple[dict[str, str], bytes | None]:
    """A multipart form read within --body-limit: its text fields and the ``file`` part's bytes."""
    raw = await read_body(request)

    async def body() -> AsyncGenerator[bytes, None]:
        yield raw

    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError("expected a multipart/form-data body with a 'file' part")
    try:
        form = await MultiPartParser(request.headers, body()).parse()
    except MultiPartException as exc:
        raise APIError(f"the form could not be read: {exc.message}") from None
    fields: dict[str, str] = {}
    audio: bytes | None = None
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            if key == "file":
                audio = await value.read()
            await value.close()
        elif key in transcriptions.FIELDS:
            fields[key] = value
    return fields, audio
