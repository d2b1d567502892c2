"""Engine jobs from a request's shared fields, for every generating route (native, OpenAI
completions and chat, and the families built on chat): the token-limit order, the slot and
context checks, the sampling settings, n choices of one prompt."""

from __future__ import annotations

from dataclasses import replace

from llamaserve.engine.reasoning_budget import ReasoningBudgetSpec
from llamaserve.engine.sampling import SamplingParams
from llamaserve.engine.types import GenerationRequest
from llamaserve.errors import APIError
from llamaserve.protocol.common import SamplingFields
from llamaserve.serving.params import sampling_config, stop_strings
from llamaserve.serving.runtime import ModelRuntime


def request_sampling(
    rt: ModelRuntime, req: SamplingFields, *, grammar: str | None = None, grammar_triggers: tuple[str, ...] = ()
) -> SamplingParams:
    """The request's sampling settings over the server's; a grammar from the route (a JSON
    schema, the tool-call grammar) replaces the request's own, with its lazy triggers."""
    sampling = sampling_config(req, rt.config.sampling, rt.model)
    if grammar is not None:
        sampling = replace(sampling, grammar=grammar)
    if grammar_triggers:
        sampling = replace(sampling, grammar_triggers=grammar_triggers)
    return sampling


def build_request(
    rt: ModelRuntime,
    req: SamplingFields,
    tokens: list[int],
    *,
    n_predict: int | None,
    stop: str | list[str] | None,
    grammar: str | None = None,
    sampling: SamplingParams | None = None,
    n_probs: int = -1,
    reasoning_budget: ReasoningBudgetSpec | None = None,
) -> GenerationRequest:
    """Engine request from the shared fields; checks the prompt fits a slot. `sampling`, when
    the caller has built it (`request_sampling`), is used as it is; else `grammar` goes in."""
    rt.require_generation()
    if not tokens:
        raise APIError("the prompt is empty")
    if len(tokens) >= rt.n_ctx_slot:
        raise APIError(
            f"the request exceeds the available context size ({len(tokens)} tokens, context is "
            f"{rt.n_ctx_slot}); try increasing it",
            "exceed_context_size_error",
            extra={"n_prompt_tokens": len(tokens), "n_ctx": rt.n_ctx_slot},
        )
    if req.id_slot is not None and req.id_slot >= rt.engine.n_slots:
        raise APIError(f"id_slot: there is no slot {req.id_slot}")
    # llama-server's order: the body's n_predict, then the route's own limit (max_tokens,
    # max_completion_tokens), then -n.
    limit = req.n_predict if req.n_predict is not None else n_predict
    if limit is None:
        limit = rt.config.n_predict
    if sampling is None:
        sampling = request_sampling(rt, req, grammar=grammar)
    return GenerationRequest(
        prompt_tokens=tokens,
        sampling=sampling,
        n_predict=limit,
        stop=stop_strings(stop, rt.config.reverse_prompts),
        cache_prompt=rt.config.cache_prompt if req.cache_prompt is None else req.cache_prompt,
        id_slot=-1 if req.id_slot is None else req.id_slot,
        t_max_predict_ms=req.t_max_predict_ms or 0,
        n_indent=req.n_indent or 0,
        n_keep=rt.config.n_keep if req.n_keep is None else req.n_keep,
        n_discard=req.n_discard or 0,
        n_cache_reuse=-1 if req.n_cache_reuse is None else req.n_cache_reuse,
        lora=rt.lora.for_request(req.lora),
        n_probs=n_probs,
        post_sampling_probs=bool(req.post_sampling_probs),
        timings_per_token=bool(req.timings_per_token),
        return_progress=bool(req.return_progress),
        priority=req.priority or 0,
        reasoning_budget=reasoning_budget,
    )


def wants_verbose(rt: ModelRuntime, req: SamplingFields) -> bool:
    """`__verbose` in OpenAI answers: the request's `verbose`, else on with -v (llama-server's rule)."""
    return req.verbose if req.verbose is not None else rt.config.log_verbosity > 9


def choices(rt: ModelRuntime, job: GenerationRequest, n: int, field: str = "n") -> list[GenerationRequest]:
    """n choices of one prompt; with a fixed seed each choice gets seed + i so they differ.
    ``field`` names the count in the error: more choices than slots can never run at once."""
    if n > rt.engine.n_slots:
        raise APIError(f"{field}: at most {rt.engine.n_slots} choices (the number of slots)")
    if n == 1:
        return [job]
    seed = job.sampling.seed
    return [
        job if i == 0 else replace(job, sampling=replace(job.sampling, seed=(seed + i) if seed >= 0 else -1))
        for i in range(n)
    ]
