"""--log-prompts-dir: one text file per generation request, for debugging.

llama-server writes each completion request's prompt (the rendered chat prompt for chat
routes) to `<dir>/<milliseconds, 12 digits>.txt` before processing it. We write the same
file, the prompt as the model saw it (special tokens included), and when the request
ends, its answer after a marker line (each choice's, for n > 1; whatever was generated
when a client went away). Every generation route goes through the engine client, so
wrapping it covers them all. It lives beside the client, not in serving/, because it is
built over the scheduler, which only the engine and the composition root may name.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator

from llamaserve.engine.backend import Vocabulary
from llamaserve.engine.client import EngineClient
from llamaserve.engine.kv.files import SlotFiles
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.types import Event, GenerationRequest, TextDelta

log = logging.getLogger("llamaserve")

ANSWER_MARKER = "\n\n----- answer{} -----\n"


def prompt_file(directory: str) -> str:
    """A fresh `<ms>.txt` path (llama-server's name; a suffix when two requests share a millisecond)."""
    stem = os.path.join(directory, f"{int(time.time() * 1000):012d}")
    path, n = f"{stem}.txt", 1
    while os.path.exists(path):
        path, n = f"{stem}-{n}.txt", n + 1
    return path


class PromptLoggingClient(EngineClient):
    """The engine client, writing each request's prompt and answer to a file."""

    def __init__(
        self,
        scheduler: Scheduler,
        vocab: Vocabulary,
        directory: str,
        *,
        slot_files: SlotFiles | None = None,
        persist_slots: bool = False,
    ) -> None:
        super().__init__(scheduler, slot_files=slot_files, persist_slots=persist_slots)
        self.vocab = vocab
        self.directory = directory

    async def generate_choices(self, requests: list[GenerationRequest]) -> AsyncIterator[tuple[int, Event]]:
        # Small synchronous writes: this is a debugging aid, and a worker-thread hop per
        # request would cost more than the write.
        path = self._write_prompt(requests[0].prompt_tokens) if requests else None
        answers: list[list[str]] = [[] for _ in requests]
        try:
            async for index, event in super().generate_choices(requests):
                if isinstance(event, TextDelta):
                    answers[index].append(event.text)
                yield index, event
        finally:
            if path is not None:
                self._write_answers(path, answers)

    def _write_prompt(self, tokens: list[int]) -> str | None:
        try:
            os.makedirs(self.directory, exist_ok=True)
            path = prompt_file(self.directory)
            with open(path, "w", encoding="utf-8") as f:
                f.write(self.vocab.detokenize(tokens, special=True))
        except OSError as exc:  # a full disk must not fail the request
            log.error("--log-prompts-dir: could not write the prompt: %s", exc)
            return None
        return path

    def _write_answers(self, path: str, answers: list[list[str]]) -> None:
        try:
            with open(path, "a", encoding="utf-8") as f:
                for i, parts in enumerate(answers):
                    f.write(ANSWER_MARKER.format(f" {i}" if len(answers) > 1 else ""))
                    f.write("".join(parts))
        except OSError as exc:
            log.error("--log-prompts-dir: could not write the answer: %s", exc)
