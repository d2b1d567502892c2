"""What one sampled token does to its request: the text it adds, and whether the request ends.

The scheduler hands every sampled token of a slot here, in order. This is llama-server's stop
logic: an end-of-generation token ("eos"), a stop string ("word"), `n_predict`, a full slot
context, `t_max_predict_ms` or a line indented less than `n_indent` ("limit"); a full context
shifts instead where --context-shift allows it.
"""

from __future__ import annotations

from llamaserve.engine.kv.prepare import SlotKV
from llamaserve.engine.kv.slot import Slot
from llamaserve.engine.runner import Runner, Sample
from llamaserve.engine.slot_reports import slot_timings
from llamaserve.engine.types import Event, TextDelta


def take_token(
    slot: Slot, sample: Sample, now: float, runner: Runner, kv: SlotKV, show_special: bool, events: list[Event]
) -> str:
    """Append the token's text events to ``events``; return its stop type, "" while it goes on.

    On a stop the text still held back (a partial stop string, an incomplete UTF-8 character)
    is flushed into ``events``; the caller appends the `Finished` event after it.
    """
    task = slot.task
    assert task is not None
    req = task.request
    if req.n_predict == 0:  # only the prompt was wanted (e.g. scored with echo)
        return "limit"
    token = sample.token
    if slot.reasoning is not None:
        # The budget is spent: the closing tokens replace what the model sampled.
        forced = slot.reasoning.next_forced()
        if forced is not None:
            token = forced
            sample = Sample(token)
    slot.generated.append(token)
    if runner.is_eog(token) and not req.sampling.ignore_eos:
        if sample.logprob is not None:
            slot.unsent_logprobs.append(sample.logprob)  # the end token's own probability
        # An end token's piece is empty unless -sp shows special tokens: then the text ends
        # with it (<|im_end|>), as llama-server's does.
        shown = show_special or token in req.preserved_tokens
        tail = slot.stream.push(runner.piece(token, special=True)) if shown else ""
        _flush(slot, tail, events)
        return "eos"
    take_text(slot, sample, now, runner, events)
    if slot.stream.stopped:
        return "word"  # the stream already cut the text at the stop string
    stop_type = ""
    if slot.stream.indent_stopped or (req.n_predict >= 0 and len(slot.generated) >= req.n_predict):
        stop_type = "limit"
    elif slot.n_past + 1 >= slot.n_ctx:
        if not kv.shifts_context or not kv.shift(slot):
            stop_type = "limit"  # the slot's context is full
    elif slot.stream.saw_newline and 0 < req.t_max_predict_ms < (now - slot.t_prompt_done) * 1000.0:
        stop_type = "limit"
    if stop_type:
        _flush(slot, "", events)
    else:
        slot.next_token = token
    return stop_type


def take_text(slot: Slot, sample: Sample, now: float, runner: Runner, events: list[Event]) -> None:
    """The text of a sampled token that does not end its request: a TextDelta in ``events``
    once the detokenizer and the stop strings let some text out."""
    task = slot.task
    assert task is not None
    req = task.request
    token = sample.token
    slot.unsent_tokens.append(token)
    if sample.logprob is not None:
        slot.unsent_logprobs.append(sample.logprob)
    piece = runner.piece(token, special=token in req.preserved_tokens)
    text = slot.stream.push(piece)
    if slot.reasoning is not None:
        slot.reasoning.observe(piece.decode("utf-8", errors="replace"))
    if text:
        timings = slot_timings(slot, now) if req.timings_per_token else None
        events.append(TextDelta(text, slot.unsent_tokens, slot.unsent_logprobs, timings))
        slot.unsent_tokens, slot.unsent_logprobs = [], []


def goes_on_whatever_its_text(slot: Slot, sample: Sample, runner: Runner) -> bool:
    """Whether the request surely goes on after this token, without its text being looked at:
    none of the stops that read the text (stop strings, `n_indent`, `t_max_predict_ms`, a
    reasoning budget) applies to it, and the token is no end, no limit, no full context. Then
    `take_token_early` and, later, `take_text` do what `take_token` would (the scheduler
    runs the text's half while the next step runs)."""
    task = slot.task
    if task is None or slot.reasoning is not None:
        return False
    req = task.request
    stream = slot.stream
    return (
        not stream.stop
        and stream.min_indent <= 0
        and req.t_max_predict_ms <= 0
        and not req.timings_per_token
        and req.n_predict != 0
        and (req.n_predict < 0 or len(slot.generated) + 1 < req.n_predict)
        and slot.n_past + 1 < slot.n_ctx
        and (req.sampling.ignore_eos or not runner.is_eog(sample.token))
    )


def take_token_early(slot: Slot, sample: Sample) -> None:
    """`take_token`'s half that the next step needs, for a token `goes_on_whatever_its_text`."""
    slot.generated.append(sample.token)
    slot.next_token = sample.token


def _flush(slot: Slot, tail: str, events: list[Event]) -> None:
    """The request ends: the text and tokens not yet sent go out in one last delta."""
    tail += slot.stream.flush()
    if tail or slot.unsent_tokens:
        events.append(TextDelta(tail, slot.unsent_tokens, slot.unsent_logprobs))
        slot.unsent_tokens, slot.unsent_logprobs = [], []
