"""The rows of one step: each generating slot's next token (with its speculative draft), then
prompt chunks of slots in prefill, within one micro-batch.

`Scheduler._build_plan` calls these; they only read and mark slots (prefill credit), the
scheduler runs the plan and applies its results.
"""

from __future__ import annotations

from collections.abc import Callable

from llamaserve.engine.admission import prefill_order
from llamaserve.engine.backend import media_slot
from llamaserve.engine.kv.slot import Slot, SlotState
from llamaserve.engine.runner import PlanRow


def adapter_sets(slots: list[Slot]) -> list[tuple[float, ...]]:
    """The distinct LoRA scale sets of the slots with work this step, in slot order."""
    sets: list[tuple[float, ...]] = []
    for slot in slots:
        ready = slot.state is SlotState.PREFILL or (slot.state is SlotState.GENERATING and slot.next_token is not None)
        if ready and slot.task is not None and slot.task.request.lora not in sets:
            sets.append(slot.task.request.lora)
    return sets


# Prompt tokens per step for a prompt of lower priority than a request that is generating.
BACKGROUND_CHUNK = 16


def decode_rows_beside_prefill(slots: list[Slot], lora: tuple[float, ...]) -> list[Slot]:
    """``slots`` less the generating ones of lower priority than a prompt waiting to be prefilled
    under ``lora``: they sit that step out, so a request's prefill step carries no background
    rows (each costs about a prompt token on a CPU)."""
    waiting = [
        _priority(s)
        for s in slots
        if s.state is SlotState.PREFILL and s.task is not None and s.task.request.lora == lora
    ]
    if not waiting:
        return slots
    urgent = min(waiting)
    return [s for s in slots if s.state is not SlotState.GENERATING or _priority(s) <= urgent]


def plan_generating(
    slots: list[Slot],
    lora: tuple[float, ...],
    drafts: dict[int, list[int]],
    synth_for: Callable[[int], Callable[[int], bool] | None] | None,
    budget: int,
) -> tuple[list[PlanRow], list[Slot], int]:
    """A row per generating slot under ``lora``: its sampled token and its draft. Returns the
    rows, their slots, and the budget left for prompt tokens."""
    plan: list[PlanRow] = []
    planned: list[Slot] = []
    for slot in slots:
        if slot.task is not None and slot.task.request.lora != lora:
            continue  # llama.cpp applies one adapter set to a whole decode
        if slot.state is SlotState.GENERATING and slot.next_token is not None and budget > 0:
            assert slot.sampler is not None and slot.task is not None
            req = slot.task.request
            draft = drafts.get(slot.id, [])
            plan.append(
                PlanRow(
                    slot.id,
                    [slot.next_token, *draft],
                    slot.n_past,
                    [slot.sampler],
                    req.n_probs,
                    post_sampling=req.post_sampling_probs,
                    draft=draft,
                    synth=synth_for(slot.id) if draft and synth_for is not None else None,
                )
            )
            planned.append(slot)
            slot.next_token = None
            budget -= 1 + len(draft)
    return plan, planned, budget


def plan_prefill(
    slots: list[Slot], lora: tuple[float, ...], budget: int, n_ubatch: int, plan: list[PlanRow], planned: list[Slot]
) -> None:
    """Append prompt chunks of slots in prefill under ``lora`` to ``plan``, within ``budget``."""
    # A short prompt overtakes a long prefill (its first token comes sooner and the long one
    # barely notices); priority first, and waiting earns credit so nothing starves.
    prefilling = sorted(
        (s for s in slots if s.state is SlotState.PREFILL and s.task is not None and s.task.request.lora == lora),
        key=lambda s: prefill_order(_priority(s), s.prompt_remaining, s.prefill_credit),
    )
    # One priority per step: on a CPU a step's time grows with its prompt tokens, so a
    # background prompt (a Batch API line) sharing the step with an interactive one would
    # double that request's time to its first token. Equal priorities still share steps.
    if prefilling:
        urgent = _priority(prefilling[0])
        prefilling = [s for s in prefilling if _priority(s) == urgent]
        # While more urgent requests are generating, a background prompt goes in small
        # chunks: a request that arrives meanwhile waits at most for one short step.
        if any(_priority(s) < urgent for s in slots if s.task is not None):
            budget = min(budget, BACKGROUND_CHUNK)
    for slot in prefilling:
        if budget <= 0:
            break
        start = slot.n_past
        scoring = slot.task is not None and slot.task.request.prompt_logprobs
        if slot.prompt[start] < 0:
            # An image or audio clip goes in one step, whole: projectors such as gemma3's
            # want its embeddings to attend to each other, which holds only within one
            # decode. It may take the step past the text budget, as media rows go to the
            # runner's batch of embeddings, not the token batch.
            chunk = media_item(slot.prompt, start, n_ubatch)
        else:
            # Keeping every row's logits costs a vocabulary-sized row each: smaller chunks.
            chunk = one_kind(slot.prompt[start : start + (min(budget, 64) if scoring else budget)])
        last_chunk = start + len(chunk) == len(slot.prompt)
        samplers = [slot.sampler, *(f.sampler for f in slot.followers)] if last_chunk else []
        n_probs = slot.task.request.n_probs if slot.task else -1
        post = slot.task is not None and slot.task.request.post_sampling_probs
        targets = slot.prompt[start + 1 : start + len(chunk) + 1] if scoring else None
        plan.append(PlanRow(slot.id, chunk, start, samplers, n_probs, targets, post))  # type: ignore[arg-type]
        planned.append(slot)
        budget -= len(chunk)
    credit_waiting_prefills(prefilling, plan)


def _priority(slot: Slot) -> int:
    return slot.task.request.priority if slot.task is not None else 0


def credit_waiting_prefills(prefilling: list[Slot], plan: list[PlanRow]) -> None:
    """A prompt left out of a step earns the tokens the step spent on other prompts."""
    scheduled = {row.seq_id: len(row.tokens) for row in plan}
    spent = sum(scheduled.get(s.id, 0) for s in prefilling)
    for slot in prefilling:
        if slot.id not in scheduled:
            slot.prefill_credit += spent


def media_item(prompt: list[int], start: int, limit: int) -> list[int]:
    """The placeholders of the media item that begins at ``start``, at most ``limit`` of them
    (an item longer than a micro-batch cannot be decoded in one anyway)."""
    item = media_slot(prompt[start])[0]
    end = start
    while end < len(prompt) and end - start < limit and prompt[end] < 0 and media_slot(prompt[end])[0] == item:
        end += 1
    return prompt[start:end]


def one_kind(chunk: list[int]) -> list[int]:
    """The chunk up to where text turns into media or back (media placeholders are negative):
    the runner decodes media rows in a batch of embeddings, text in a batch of tokens."""
    if not chunk or min(chunk) >= 0:  # the usual case, all text: one pass in C
        return chunk
    media = chunk[0] < 0
    for i, tok in enumerate(chunk):
        if (tok < 0) != media:
            return chunk[:i]
    return chunk
