"""Text completion routes: llama-server's /completion and /infill, OpenAI's /v1/completions."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.http import JSONUTF8Response, note_tokens, read_json, runtime_of, stream_events, with_usage
from llamaserve.api.sse import until_disconnect
from llamaserve.errors import APIError
from llamaserve.families.completions import serving as completion
from llamaserve.families.completions.protocol import CompletionRequest, InfillRequest, NativeCompletionRequest
from llamaserve.serving import generate
from llamaserve.serving.jobs import wants_verbose
from llamaserve.serving.state import ServerState


def completion_routes(state: ServerState) -> APIRouter:
    """The native routes first: they own the `completions` alias of Vertex AI's /predict."""
    router = APIRouter()

    @router.post("/infill")
    async def infill(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, InfillRequest)
        jobs, prompt = await completion.infill_request(rt, req)
        if req.stream:
            events = generate.stream(rt.engine, jobs)
            return await stream_events(
                request,
                events,
                lambda ev: completion.native_stream(rt, req, jobs, prompt, ev),
                ping_interval=req.sse_ping_interval,
            )
        body = await until_disconnect(request, completion.native_complete(rt, req, [(jobs, prompt)]))
        return JSONUTF8Response(body)

    @router.post("/completion")
    @router.post("/completions")
    async def native_completion(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, NativeCompletionRequest)
        jobs = await completion.native_requests(rt, req)
        if req.stream:
            if len(jobs) != 1:
                raise APIError("streaming supports a single prompt")
            group, prompt = jobs[0]
            events = generate.stream(rt.engine, group)
            return await stream_events(
                request,
                events,
                lambda ev: completion.native_stream(rt, req, group, prompt, ev),
                ping_interval=req.sse_ping_interval,
            )
        body = await until_disconnect(request, completion.native_complete(rt, req, jobs))
        first = body if isinstance(body, dict) else body[0]
        # response_fields may have left any of these out of the answer
        cache_n = first.get("timings", {}).get("cache_n", 0)
        note_tokens(request, first.get("tokens_evaluated", 0), cache_n, first.get("tokens_predicted", 0))
        return JSONUTF8Response(body)

    @router.post("/v1/completions")
    async def oai_completion(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, CompletionRequest)
        groups = await completion.oai_requests(rt, req)
        if req.stream:
            if len(groups) != 1:
                raise APIError("streaming supports a single prompt")
            events = generate.stream(rt.engine, groups[0])
            return await stream_events(
                request,
                events,
                lambda ev: completion.oai_stream(rt, req, groups[0], ev),
                ping_interval=req.sse_ping_interval,
            )
        answer = completion.oai_complete(rt, groups, verbose=wants_verbose(rt, req))
        return with_usage(request, await until_disconnect(request, answer))

    return router
