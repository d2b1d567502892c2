"""What a slot reports of its request: llama-server's `timings`, `prompt_progress` and the final summary."""

from __future__ import annotations

from llamaserve.engine.kv.slot import Slot
from llamaserve.engine.types import Finished, GenerationRequest, PromptProgress, TextDelta, Timings


def slot_timings(slot: Slot, now: float) -> Timings:
    """The request's timings so far: the prompt until its last batch, generation since."""
    gen_ms = (now - slot.t_prompt_done) * 1000.0 if slot.t_prompt_done else 0.0
    prompt_ms = ((slot.t_prompt_done or now) - slot.t_start) * 1000.0
    return Timings(
        cache_n=slot.n_cached,
        prompt_n=len(slot.prompt) - slot.n_cached,
        prompt_ms=prompt_ms,
        predicted_n=len(slot.generated),
        predicted_ms=gen_ms,
        queue_ms=(slot.t_start - slot.task.t_submit) * 1000.0 if slot.task and slot.task.t_submit else 0.0,
        draft_n=slot.n_draft,
        draft_n_accepted=slot.n_draft_accepted,
    )


def progress_event(slot: Slot, request: GenerationRequest, now: float) -> TextDelta:
    """A `prompt_progress` report, with the prompt's timings so far when `timings_per_token` asks."""
    progress = PromptProgress(
        total=len(slot.prompt),
        cache=slot.n_cached,
        processed=min(slot.n_past, len(slot.prompt)),
        time_ms=round((now - slot.t_start) * 1000.0, 3),
    )
    timings = None
    if request.timings_per_token:
        # The prompt part so far, as llama-server reports it: nothing before the first batch.
        done = max(progress.processed - slot.n_cached, 0)
        timings = Timings(cache_n=slot.n_cached, prompt_n=done, prompt_ms=progress.time_ms if done else 0.0)
    return TextDelta("", [], progress=progress, timings=timings)


def finished_event(slot: Slot, stop_type: str, now: float) -> Finished:
    """The request's last event: why it stopped, what it cost, what the slot held."""
    return Finished(
        stop_type=stop_type,
        stopping_word=slot.stream.stopping_word,
        n_prompt_tokens=len(slot.prompt),
        n_cached=slot.n_cached,
        n_predicted=len(slot.generated),
        timings=slot_timings(slot, now),
        id_slot=slot.id,
        truncated=slot.truncated,
        prompt_logprobs=slot.prompt_logprobs,
        t_done=now,
    )
