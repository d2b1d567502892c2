"""The Ray Serve ingress: every HTTP route, each request sent to the replica the prefix router picks.

The ingress answers `/health` itself (200 while a replica is known) and `/metrics` (each
replica's, labelled `replica`, asked one by one); `/replicas` lists the replicas with their
in-flight and served counts. Everything else goes to a replica through a streaming
deployment handle: the replica's first item is the status and headers, the rest is the
body as it arrives (SSE unbuffered). A replica that dies mid-answer ends that stream with
an error event in the API family's shape; one that dies before answering is a 503.
Stored Responses stay on the replica that created them: the ingress reads each created
response's id from the answer and sends its `previous_response_id` followers there.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from llamaserve.edge.metrics import merge_metrics
from llamaserve.errors import APIError
from llamaserve.ray.replica import stream_error
from llamaserve.ray.routing import ROUTERS
from llamaserve.scale.front import UPSTREAM_HEADER, response_ids, session_key
from llamaserve.scale.prefix_index import block_hashes, prompt_text

log = logging.getLogger("llamaserve.ray")

_MAX_RESPONSES = 100_000


def _error(request: Request, exc: APIError) -> Response:
    anthropic = request.url.path.startswith("/v1/messages")
    return JSONResponse(exc.anthropic_body() if anthropic else exc.openai_body(), status_code=exc.status)


class Ingress:
    """The deployment class's body (llamaserve/ray/deploy.py wraps it with @serve.deployment)."""

    def __init__(self, replicas: Any) -> None:
        self.replicas = replicas
        self.owners: OrderedDict[str, str] = OrderedDict()  # response id → replica id
        self.pids: dict[str, int] = {}  # replica id → its process, as the replica reported it

    def _remember(self, response_id: str, replica: str) -> None:
        self.owners[response_id] = replica
        self.owners.move_to_end(response_id)
        while len(self.owners) > _MAX_RESPONSES:
            self.owners.popitem(last=False)

    def members(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for router in ROUTERS:
            for member in router.balancer.members.values():
                out.append(
                    {
                        "id": member.url,
                        "in_flight": member.inflight,
                        "served": member.served,
                        "pid": self.pids.get(member.url),
                    }
                )
        return out

    def finished(self, replica: str) -> None:
        for router in ROUTERS:
            member = router.balancer.members.get(replica)
            if member is not None:
                router.balancer.finished(member)

    async def _open(self, hint: dict[str, Any], request: Request, body: bytes) -> tuple[dict[str, Any], Any]:
        """The chosen replica's first item (status, headers) and the rest of its stream.

        A replica that fails before its first item (it died, and Ray has not yet told this
        ingress) has sent nothing to the client: the request is tried once on another.
        """
        last: Exception | None = None
        for _ in range(2):
            stream = self.replicas.options(stream=True).forward.remote(
                hint, request.method, request.url.path, request.url.query, list(request.headers.items()), body
            )
            try:
                return await stream.__anext__(), stream
            except Exception as exc:
                log.warning("replica failed before answering %s: %s", request.url.path, type(exc).__name__)
                last = exc
        raise APIError(f"replica unavailable: {type(last).__name__}", "unavailable_error") from last

    async def handle(self, request: Request) -> Response:
        try:
            return await self._handle(request)
        except APIError as exc:
            return _error(request, exc)

    async def _handle(self, request: Request) -> Response:
        path = request.url.path
        if path in ("/health", "/v1/health"):
            return JSONResponse({"status": "ok"})
        if path == "/replicas":
            return JSONResponse({"replicas": self.members()})
        if path == "/metrics":
            return await self._metrics(request)
        body = await request.body()
        parsed: Any = None
        if request.method == "POST" and body:
            try:
                parsed = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                parsed = None
        previous = ""
        if isinstance(parsed, dict) and isinstance(parsed.get("previous_response_id"), str):
            previous = parsed["previous_response_id"]
        if path.startswith("/v1/responses/") and request.method in ("GET", "DELETE"):
            previous = path.split("/")[3]
        hint = {
            "hashes": block_hashes(prompt_text(parsed)) if parsed is not None else [],
            "session": session_key(request.headers, request.query_params.get("conv_id")),
            "previous": previous,
            "previous_owner": self.owners.get(previous, "") if previous else "",
        }
        head, stream = await self._open(hint, request, body)
        replica = str(head["replica"])
        self.pids[replica] = int(head.get("pid", 0))
        headers = [(k, v) for k, v in head["headers"]] + [(UPSTREAM_HEADER, replica)]
        is_sse = any(k.lower() == "content-type" and v.startswith("text/event-stream") for k, v in headers)
        sniff = path.startswith("/v1/responses")

        async def relay() -> AsyncIterator[bytes]:
            seen = b""
            try:
                async for chunk in stream:
                    if sniff and len(seen) < 65_536:
                        seen += chunk
                        for rid in response_ids(seen):
                            self._remember(rid, replica)
                    yield chunk
            except Exception as exc:  # the replica died mid-answer: only this answer fails
                log.warning("replica %s broke mid-answer on %s: %s", replica, path, type(exc).__name__)
                if is_sse:
                    yield stream_error(path, f"the replica serving this request stopped ({type(exc).__name__})")
            finally:
                # A client that went away: cancelling the call closes the replica's connection
                # to its server, which frees the slot.
                with contextlib.suppress(Exception):
                    stream.cancel()
                self.finished(replica)

        response = StreamingResponse(relay(), status_code=int(head["status"]))
        response.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        return response

    async def _metrics(self, request: Request) -> Response:
        texts: dict[str, str] = {}
        for member in self.members():
            hint = {"hashes": [], "pin": member["id"]}
            try:
                head, stream = await self._open(hint, request, b"")
                text = b"".join([chunk async for chunk in stream]).decode("utf-8", "replace")
            except APIError:
                continue
            if head["status"] == 200:
                texts[str(head["replica"])] = text
        own = [("llamaserve:ray_replicas", "Replicas the ingress routes to.", "gauge", float(len(texts)))]
        merged = merge_metrics(texts, own).replace('{model="', '{replica="')
        return Response(merged, media_type="text/plain; version=0.0.4")
