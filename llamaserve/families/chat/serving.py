"""A chat request, built: messages → template (with media) → prompt tokens, grammar and
reasoning settings → the engine's jobs (`ChatJobs`) and the plan that parses their text. Their
answers are shaped in `answers.py`."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Any

from llamaserve.chat.parsed import (
    ParsedMessage,
)
from llamaserve.chat.reasoning import ReasoningSplitter, split_reasoning, template_opens_thinking
from llamaserve.chat.template import TemplateError
from llamaserve.chat.tools import ToolChoiceError, ToolFormat, chain, normalize_tool_choice
from llamaserve.chat.tools.generic import GenericFormat
from llamaserve.engine.reasoning_budget import ReasoningBudgetSpec
from llamaserve.engine.sampling import GrammarError
from llamaserve.engine.types import GenerationRequest
from llamaserve.errors import APIError
from llamaserve.families.chat.protocol import ChatCompletionRequest, ChatMessage
from llamaserve.serving import media
from llamaserve.serving.jobs import build_request, choices, request_sampling, wants_verbose
from llamaserve.serving.params import prompt_tokens, stop_strings
from llamaserve.serving.prefill import split_prefill
from llamaserve.serving.runtime import ModelRuntime
from llamaserve.serving.structured import resolve_grammar
from llamaserve.serving.template_kwargs import render_kwargs


def render_prompt(
    rt: ModelRuntime,
    messages: list[ChatMessage],
    *,
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any] | None,
    reasoning_effort: str | None = None,
    add_generation_prompt: bool | None = None,
    continue_final_message: bool | str | None = None,
) -> str:
    """The model's own chat template applied to the conversation.

    A final assistant message is continued (prefilled) unless --no-prefill-assistant,
    or when the request asks for it with continue_final_message.
    """
    kwargs = render_kwargs(
        rt.chat_template_kwargs,
        template_kwargs,
        thinking_default=rt.config.reasoning != "off" and rt.template.caps.supports_thinking,
        reasoning_effort=reasoning_effort,
    )
    # These are ours to set; a client's copy would collide with the arguments below.
    for reserved in ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token"):
        kwargs.pop(reserved, None)
    plan = split_prefill(
        messages,
        rt.config.prefill_assistant,
        continue_final=continue_final_message,
        add_generation_prompt=add_generation_prompt,
    )
    dicts = [m.model_dump(exclude_none=True) for m in plan.messages]
    for d, m in zip(dicts, plan.messages):
        if m.content is None and "content" not in d:
            d["content"] = None
    try:
        prompt = rt.template.render(
            dicts, add_generation_prompt=plan.add_generation_prompt, tools=tools or None, **kwargs
        )
    except TemplateError as exc:
        raise APIError(str(exc)) from exc
    return prompt + (plan.prefill or "")


def request_prompt(rt: ModelRuntime, req: ChatCompletionRequest, messages: list[ChatMessage] | None = None) -> str:
    """The prompt a chat request renders (its own messages unless others are given)."""
    return render_prompt(
        rt,
        req.messages if messages is None else messages,
        tools=req.tools,
        template_kwargs=req.chat_template_kwargs,
        reasoning_effort=req.reasoning_effort,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
    )


def count_prompt_tokens(rt: ModelRuntime, req: ChatCompletionRequest) -> int:
    """The prompt a chat request would run, rendered and tokenized (no context-size check)."""
    return len(chat_tokens(rt, request_prompt(rt, req)))


async def count_tokens_with_media(rt: ModelRuntime, req: ChatCompletionRequest) -> int:
    """count_prompt_tokens, with each image or audio counted as the tokens it becomes."""
    refs = media.chat_media(req.messages)
    if not refs:
        return count_prompt_tokens(rt, req)
    blobs = await media.load_all(rt, refs)
    prompt = request_prompt(rt, req)
    return len(await media.tokenize(rt, prompt, blobs, refs, add_special=_adds_bos(rt, prompt)))


def _adds_bos(rt: ModelRuntime, prompt: str) -> bool:
    # Templates usually write the BOS token themselves; adding another would
    # change the prompt the model was trained on.
    bos = rt.model.token_text(rt.model.bos) if rt.model.bos >= 0 else ""
    return not (bos and prompt.startswith(bos))


def chat_tokens(rt: ModelRuntime, prompt: str) -> list[int]:
    return prompt_tokens(rt.model, prompt, add_special=_adds_bos(rt, prompt))


@dataclass
class ChatPlan:
    """How a chat answer's raw text is turned into content, reasoning and tool calls."""

    tool_format: ToolFormat | None = None
    tools: list[dict[str, Any]] | None = None
    reasoning_format: str = "none"  # none | deepseek | deepseek-legacy
    reasoning_open: bool = False  # the prompt itself opened the thinking block

    @property
    def parses(self) -> bool:
        return self.tool_format is not None or self.reasoning_format != "none"

    def stream_parser(self) -> Any:
        tools_offered = self.tool_format is not None
        splitter = ReasoningSplitter(self.reasoning_format, started_in_prompt=self.reasoning_open)
        if self.tool_format is None:
            return splitter
        parser = self.tool_format.stream_parser(tools_offered, self.tools, reasoning_open=self.reasoning_open)
        return parser if self.tool_format.handles_reasoning else chain(splitter, parser)

    def parse(self, text: str) -> tuple[ParsedMessage, bool]:
        """(message, truncated): truncated when a started tool call was cut off or malformed."""
        if self.tool_format is not None and self.tool_format.handles_reasoning:
            return self.tool_format.parse_ex(
                text, tools_offered=True, tools=self.tools, reasoning_open=self.reasoning_open
            )
        reasoning, content = split_reasoning(text, fmt=self.reasoning_format, started_in_prompt=self.reasoning_open)
        if self.tool_format is None:
            return ParsedMessage(content=content, reasoning=reasoning), False
        parsed, truncated = self.tool_format.parse_ex(content, tools_offered=True, tools=self.tools)
        parsed.reasoning = reasoning
        return parsed, truncated


@dataclass(frozen=True)
class ChatJobs:
    """The n choices of one chat request, how to parse their text, and whether the OpenAI
    answer carries `__verbose` (the first choice's native answer)."""

    requests: list[GenerationRequest]
    plan: ChatPlan
    verbose: bool = False
    id: str = ""  # the answer's `chatcmpl-…` id, which its running generations carry too


def new_completion_id() -> str:
    """An answer's `chatcmpl-…` id, made with the request so that the control route can find
    its running generation by the id the client has just been streamed."""
    return f"chatcmpl-{uuid.uuid4().hex}"


def _reasoning_format(rt: ModelRuntime, req: ChatCompletionRequest) -> str:
    wanted = getattr(req, "reasoning_format", None) or rt.config.reasoning_format
    if wanted not in ("auto", "none", "deepseek", "deepseek-legacy"):
        raise APIError("reasoning_format: use none, deepseek, deepseek-legacy or auto")
    if wanted == "auto":
        # Split <think> only for templates that know about reasoning, like llama-server.
        return "deepseek" if rt.template.caps.supports_thinking else "none"
    return wanted


def _with_system_text(messages: list[ChatMessage], text: str) -> list[ChatMessage]:
    """Instructions prepended to the first system message (or as a new one)."""
    if messages and messages[0].role == "system" and isinstance(messages[0].content, str):
        first = messages[0].model_copy(update={"content": f"{text}\n\n{messages[0].content}"})
        return [first, *messages[1:]]
    return [ChatMessage(role="system", content=text), *messages]


async def _answer_grammar(
    rt: ModelRuntime, req: ChatCompletionRequest, fmt: ToolFormat | None, tools: list[dict[str, Any]] | None
) -> tuple[str | None, tuple[str, ...], tuple[str, ...]]:
    """(grammar, lazy triggers, extra stop strings) that shape the answer: the request's own
    grammar, JSON schema or response format, or the tool-call format's; never both."""
    structured = await resolve_grammar(
        rt.model, grammar=req.grammar, json_schema=req.json_schema, response_format=req.response_format
    )
    spec = fmt.grammar(tools or [], req.tool_choice or "auto", req.parallel_tool_calls is not False) if fmt else None
    if spec is None:
        return structured, (), ()
    if structured is not None:
        raise APIError("tools cannot be combined with grammar, json_schema or response_format")
    try:
        await asyncio.to_thread(rt.model.check_grammar, spec.gbnf, spec.triggers)
    except GrammarError:
        raise APIError("the tool-call grammar was rejected by llama.cpp; check the tools' schemas") from None
    return spec.gbnf, tuple(spec.triggers), tuple(spec.stops)


async def chat_request(rt: ModelRuntime, req: ChatCompletionRequest) -> ChatJobs:
    """The n choices of one chat request, ready for the engine."""
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError("top_logprobs requires logprobs: true")
    try:
        mode, _ = normalize_tool_choice(req.tool_choice)
    except ToolChoiceError as exc:
        raise APIError(f"tool_choice: {exc}") from None
    tools = req.tools or None
    if mode in ("required", "named") and not tools:
        raise APIError("tool_choice requires tools")
    use_tools = bool(tools) and mode != "none"
    # --skip-chat-parsing: the tools are still rendered, but nothing constrains or parses the answer.
    pure = rt.config.skip_chat_parsing
    fmt = rt.tool_format if use_tools and not pure else None
    kwargs = dict(req.chat_template_kwargs or {})
    if rt.config.reasoning_budget == 0:
        kwargs.setdefault("enable_thinking", False)
    messages = req.messages
    # Media first: a part the model cannot take is a 400 before anything renders.
    media_refs = media.chat_media(messages)
    blobs = await media.load_all(rt, media_refs) if media_refs else []
    if fmt is not None and isinstance(fmt, GenericFormat):
        instructions = fmt.system_prompt(tools, req.tool_choice or "auto", req.parallel_tool_calls is not False)
        if instructions:
            messages = _with_system_text(messages, instructions)
    prompt = render_prompt(
        rt,
        messages,
        tools=tools if mode != "none" else None,
        template_kwargs=kwargs,
        reasoning_effort=req.reasoning_effort,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
    )

    grammar, triggers, extra_stops = await _answer_grammar(rt, req, fmt, tools)
    reasoning_fmt = "none" if pure else _reasoning_format(rt, req)
    # The generation prompt (the request's, else the rendered prompt's tail) says whether the
    # answer starts inside a reasoning block.
    generation_prompt = req.generation_prompt if req.generation_prompt is not None else prompt[-400:]
    plan = ChatPlan(
        # parse_tool_calls: false keeps the tools' grammar but leaves the calls in the text
        tool_format=fmt if req.parse_tool_calls else None,
        tools=tools,
        reasoning_format=reasoning_fmt,
        reasoning_open=template_opens_thinking(generation_prompt) if reasoning_fmt != "none" else False,
    )
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    n_probs = (req.top_logprobs or 0) if req.logprobs else (req.n_probs if req.n_probs else -1)
    stops = stop_strings(req.stop) + extra_stops
    if media_refs:
        tokens = await media.tokenize(rt, prompt, blobs, media_refs, add_special=_adds_bos(rt, prompt))
    else:
        tokens = chat_tokens(rt, prompt)
    sampling = request_sampling(rt, req, grammar=grammar, grammar_triggers=triggers)
    budget = _reasoning_budget(rt, req, plan, constrained=bool(sampling.grammar))
    job = build_request(
        rt, req, tokens, n_predict=limit, stop=list(stops), sampling=sampling, n_probs=n_probs, reasoning_budget=budget
    )
    completion_id = new_completion_id()
    job.completion_id = completion_id
    return ChatJobs(choices(rt, job, req.n), plan, wants_verbose(rt, req), completion_id)


def _reasoning_budget(
    rt: ModelRuntime, req: ChatCompletionRequest, plan: ChatPlan, *, constrained: bool
) -> ReasoningBudgetSpec | None:
    """The request's reasoning budget (else --reasoning-budget) for the engine; None when unlimited
    and not armed for `reasoning_control` (then the budget is unlimited, -1, until the control
    route ends the block).

    Only where reasoning is parsed (`<think>` blocks) and no grammar shapes the output: a
    grammar or a tool-call format decides the text itself, and forced tokens would break it.
    """
    budget = req.reasoning_budget_tokens if req.reasoning_budget_tokens is not None else rt.config.reasoning_budget
    if (budget < 0 and not req.reasoning_control) or plan.reasoning_format == "none" or constrained:
        return None
    message = rt.config.reasoning_budget_message
    close = (f"\n{message}" if message else "") + "\n</think>\n\n"
    tokens = rt.model.tokenize(close, add_special=False, parse_special=True)
    return ReasoningBudgetSpec(
        budget=max(budget, -1),
        close_tokens=tuple(tokens),
        opened_by_prompt=plan.reasoning_open,
        control=req.reasoning_control,
    )
