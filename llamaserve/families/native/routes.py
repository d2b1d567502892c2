"""llama-server's vocabulary and template routes: /tokenize, /detokenize, /apply-template."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from llamaserve.api.http import JSONUTF8Response, read_json, runtime_of
from llamaserve.errors import APIError
from llamaserve.families.chat.serving import render_prompt
from llamaserve.families.native.protocol import ApplyTemplateRequest, DetokenizeRequest, TokenizeRequest
from llamaserve.serving.state import ServerState


def native_routes(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, TokenizeRequest)
        tokens = rt.model.tokenize(req.content, add_special=req.add_special, parse_special=req.parse_special)
        if not req.with_pieces:
            return JSONUTF8Response({"tokens": tokens})
        out = []
        for t in tokens:
            raw = rt.model.piece(t, special=True)
            try:
                piece: str | list[int] = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
            out.append({"id": t, "piece": piece})
        return JSONUTF8Response({"tokens": out})

    @router.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, DetokenizeRequest)
        bad = [t for t in req.tokens if not rt.model.valid_token(t)]
        if bad:
            raise APIError(f"invalid token id {bad[0]} (vocabulary size {rt.model.n_vocab})")
        return JSONUTF8Response({"content": rt.model.detokenize(req.tokens, special=True)})

    @router.post("/apply-template")
    async def apply_template(request: Request) -> Response:
        rt = runtime_of(state)
        req = await read_json(request, ApplyTemplateRequest)
        prompt = render_prompt(
            rt,
            req.messages,
            tools=req.tools,
            template_kwargs=req.chat_template_kwargs,
            add_generation_prompt=req.add_generation_prompt,
        )
        return JSONUTF8Response({"prompt": prompt})

    return router
