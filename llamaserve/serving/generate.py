"""Running generations through the engine, whole or as streams of deltas.

Adapters for each API family build on these helpers; engine failures become
APIError here so every family reports them the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from llamaserve.engine.client import EngineClient
from llamaserve.engine.types import Failed, Finished, GenerationRequest, TextDelta, TokenLogprob
from llamaserve.errors import APIError
from llamaserve.serving.latency import RequestClock
from llamaserve.telemetry.hook import note_finished

Tagged = tuple[int, TextDelta | Finished]
"""(choice index, event): what a stream yields."""


@dataclass
class Completion:
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: Finished | None = None

    @property
    def done(self) -> Finished:
        assert self.finished is not None
        return self.finished


def failure(event: Failed) -> APIError:
    headers = {"Retry-After": str(event.retry_after_s)} if event.retry_after_s > 0 else None
    return APIError(event.message, event.kind, status=event.status, extra=dict(event.extra), headers=headers)


async def complete(engine: EngineClient, jobs: list[GenerationRequest]) -> list[Completion]:
    """Run the n choices of one prompt to the end."""
    parts: list[list[str]] = [[] for _ in jobs]
    out = [Completion() for _ in jobs]
    clock = RequestClock()
    async for index, event in engine.generate_choices(jobs):
        if isinstance(event, TextDelta):
            clock.tokens(len(event.tokens))
            parts[index].append(event.text)
            out[index].tokens += event.tokens
            out[index].logprobs += event.logprobs
        elif isinstance(event, Finished):
            note_finished(index, event)
            out[index].finished = event
            out[index].text = "".join(parts[index])
        else:
            raise failure(event)
    clock.done()
    return out


def token_counts(event: TextDelta | Finished) -> tuple[int, int, int] | None:
    """(prompt, cached, predicted) tokens once a choice has finished, for the access log; else None."""
    if isinstance(event, Finished):
        return event.n_prompt_tokens, event.n_cached, event.n_predicted
    return None


def produced_tokens(event: TextDelta | Finished) -> int:
    """The tokens a TextDelta carries (0 for a Finished or a progress report): what a stream
    cut short by its client has used, for the key's usage and token limit."""
    return len(event.tokens) if isinstance(event, TextDelta) else 0


async def stream(engine: EngineClient, jobs: list[GenerationRequest]) -> AsyncIterator[Tagged]:
    """(choice index, event) pairs; a failure raises APIError (before or mid-stream)."""
    clock = RequestClock()
    try:
        async for index, event in engine.generate_choices(jobs):
            if isinstance(event, Failed):
                raise failure(event)
            if isinstance(event, TextDelta):
                clock.tokens(len(event.tokens))
            else:
                note_finished(index, event)
            yield index, event
    finally:
        clock.done()


def finish_reason(finished: Finished) -> str:
    return "length" if finished.stop_type == "limit" else "stop"


@dataclass(frozen=True)
class Usage:
    """Tokens of one request's choices: the prompt counts once, their completions add up.
    Each API family shapes it its own way."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @classmethod
    def of(cls, finished: list[Finished]) -> Usage:
        return cls(finished[0].n_prompt_tokens, finished[0].n_cached, sum(f.n_predicted for f in finished))

    def openai(self) -> dict[str, object]:
        return {
            "completion_tokens": self.completion_tokens,
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def usage(finished: list[Finished]) -> dict[str, object]:
    """OpenAI usage of a request's finished choices."""
    return Usage.of(finished).openai()


def progress_fields(event: TextDelta) -> dict[str, Any]:
    """`prompt_progress` and per-token `timings` of a streamed delta, when it carries them."""
    out: dict[str, Any] = {}
    if event.timings is not None:
        out["timings"] = event.timings.to_json()
    if event.progress is not None:
        out["prompt_progress"] = event.progress.to_json()
    return out
