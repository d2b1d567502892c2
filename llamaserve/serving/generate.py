"""Running one generation through the engine, whole or as a stream of deltas.

Adapters for each API family build on these two helpers; engine failures
become APIError here so every family reports them the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from llamaserve.api.errors import APIError
from llamaserve.engine.client import EngineClient
from llamaserve.engine.types import Failed, Finished, GenerationRequest, TextDelta


@dataclass
class Completion:
    text: str
    tokens: list[int] = field(default_factory=list)
    finished: Finished | None = None


def failure(event: Failed) -> APIError:
    return APIError(event.message, event.kind, status=event.status, extra=dict(event.extra))


async def complete(engine: EngineClient, request: GenerationRequest) -> Completion:
    parts: list[str] = []
    tokens: list[int] = []
    async for event in engine.generate(request):
        if isinstance(event, TextDelta):
            parts.append(event.text)
            tokens += event.tokens
        elif isinstance(event, Finished):
            return Completion("".join(parts), tokens, event)
        else:
            raise failure(event)
    raise APIError("generation ended without a result", "server_error")


async def stream(engine: EngineClient, request: GenerationRequest) -> AsyncIterator[TextDelta | Finished]:
    """Deltas then one Finished; a failure raises APIError (before or mid-stream)."""
    async for event in engine.generate(request):
        if isinstance(event, Failed):
            raise failure(event)
        yield event


def finish_reason(finished: Finished) -> str:
    return "length" if finished.stop_type == "limit" else "stop"


def usage(finished: Finished) -> dict[str, object]:
    return {
        "completion_tokens": finished.n_predicted,
        "prompt_tokens": finished.n_prompt_tokens,
        "total_tokens": finished.n_prompt_tokens + finished.n_predicted,
        "prompt_tokens_details": {"cached_tokens": finished.n_cached},
    }
