"""Server-wide defaults a request inherits: -r, -l, the reasoning flags, prefill, adaptive-p, -nocb, the slot cap."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llamaserve.cli import config_from_args
from llamaserve.config import ServerConfig
from llamaserve.engine.sampling import SAMPLER_LETTERS, SCALAR_KNOBS, SamplingParams
from llamaserve.engine.scheduler import Scheduler
from llamaserve.engine.types import GenerationRequest
from llamaserve.errors import APIError
from llamaserve.families.chat.protocol import ChatMessage
from llamaserve.protocol.common import SamplingFields
from llamaserve.serving.params import sampling_config, stop_strings
from llamaserve.serving.prefill import split_prefill
from llamaserve.serving.template_kwargs import render_kwargs, server_template_kwargs

from .fake_runner import FakeRunner
from .test_scheduler import Collector, run_until_idle


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")  # the flags are only validated: a file must exist
    return str(p)


def test_reverse_prompts_stand_in_only_for_an_empty_stop_list() -> None:
    defaults = ("\n", "User:")
    assert stop_strings(None, defaults) == defaults
    assert stop_strings([], defaults) == defaults
    assert stop_strings(["", ""], defaults) == defaults  # empty words do not count, as in llama-server
    assert stop_strings(["END"], defaults) == ("END",)
    assert stop_strings("END", defaults) == ("END",)


class _NoVocab:
    """sampling_config only tokenizes string keys of logit_bias; ids are range-checked."""

    n_vocab = 100

    def valid_token(self, token: int) -> bool:
        return 0 <= token < self.n_vocab


def test_a_request_logit_bias_replaces_the_servers() -> None:
    defaults = SamplingParams(logit_bias=((5, 1.0),))
    vocab = _NoVocab()
    assert sampling_config(SamplingFields(), defaults, vocab).logit_bias == ((5, 1.0),)  # type: ignore[arg-type]
    asked = sampling_config(SamplingFields(logit_bias={"7": -2.0}), defaults, vocab)  # type: ignore[arg-type]
    assert asked.logit_bias == ((7, -2.0),)
    cleared = sampling_config(SamplingFields(logit_bias=[]), defaults, vocab)  # type: ignore[arg-type]
    assert cleared.logit_bias == ()


def test_adaptive_p_knobs_are_request_fields_cli_flags_and_a_sampler(model_file: str) -> None:
    assert {"adaptive_target", "adaptive_decay"} <= set(SCALAR_KNOBS)
    assert SAMPLER_LETTERS["a"] == "adaptive_p"
    cfg = config_from_args(
        ["-m", model_file, "--adaptive-target", "0.3", "--adaptive-decay", "0.5", "--samplers", "top_k;adaptive_p"],
        environ={},
    )
    assert (cfg.sampling.adaptive_target, cfg.sampling.adaptive_decay) == (0.3, 0.5)
    assert cfg.sampling.samplers == ("top_k", "adaptive_p")
    req = sampling_config(SamplingFields(adaptive_target=0.7), cfg.sampling, _NoVocab())  # type: ignore[arg-type]
    assert req.adaptive_target == 0.7 and req.adaptive_decay == 0.5
    with pytest.raises(ValueError):
        SamplingFields(adaptive_decay=1.5)


def test_reasoning_flags_become_template_kwargs() -> None:
    base = ServerConfig()
    assert server_template_kwargs(base, {"x": 1}) == {"x": 1}
    off = replace(base, reasoning="off", reasoning_effort="high", reasoning_preserve=False)
    kwargs = server_template_kwargs(off, {"enable_thinking": True})
    assert kwargs == {"enable_thinking": False, "reasoning_effort": "high", "preserve_reasoning": False}
    rendered = render_kwargs(kwargs, None, thinking_default=True)
    assert rendered["enable_thinking"] is False
    assert rendered["reasoning_strength"] == "high"
    assert rendered["preserve_thinking"] is False and rendered["clear_thinking"] is True


def test_request_kwargs_and_reasoning_effort_win_over_the_servers() -> None:
    server = {"reasoning_effort": "high"}
    assert render_kwargs(server, {"reasoning_effort": "low"}, thinking_default=False)["reasoning_effort"] == "low"
    assert render_kwargs(server, None, thinking_default=True, reasoning_effort="medium")["reasoning_effort"] == "medium"
    none = render_kwargs(server, None, thinking_default=True, reasoning_effort="none")
    assert "reasoning_effort" not in none and none["enable_thinking"] is False
    # auto: the template's thinking is on where it supports it, off elsewhere (llama-server's context value)
    assert render_kwargs({}, None, thinking_default=True)["enable_thinking"] is True
    assert render_kwargs({}, {"enable_thinking": False}, thinking_default=True)["enable_thinking"] is False


def _msg(role: str, content: str | None = "x", **kw: object) -> ChatMessage:
    return ChatMessage(role=role, content=content, **kw)  # type: ignore[arg-type]


def test_prefill_continues_a_final_assistant_message_unless_disabled() -> None:
    convo = [_msg("user", "hi"), _msg("assistant", "Once upon")]
    plan = split_prefill(convo, True)
    assert [m.role for m in plan.messages] == ["user"] and plan.prefill == "Once upon"
    assert plan.add_generation_prompt  # the rest is rendered up to the assistant's header
    off = split_prefill(convo, False)
    assert (off.messages, off.prefill) == (convo, None)
    parts = [
        _msg("user"),
        ChatMessage(role="assistant", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
    ]
    # llama-server joins text parts with a blank line
    assert split_prefill(parts, True).prefill == "a\n\nb"
    with pytest.raises(APIError, match="2 or more assistant"):
        split_prefill([_msg("user"), _msg("assistant"), _msg("assistant")], True)
    with pytest.raises(APIError, match="tool calls"):
        split_prefill([_msg("user"), _msg("assistant", None, tool_calls=[{"id": "1"}])], True)


def test_continue_final_message_is_explicit_prefill_and_excludes_the_generation_prompt() -> None:
    convo = [_msg("user", "hi"), _msg("assistant", "Once upon")]
    # explicit, even with --no-prefill-assistant
    plan = split_prefill(convo, False, continue_final=True, add_generation_prompt=False)
    assert plan.prefill == "Once upon"
    assert split_prefill(convo, False, continue_final="content", add_generation_prompt=False).prefill == "Once upon"
    with pytest.raises(APIError, match="add_generation_prompt and continue_final_message"):
        split_prefill(convo, True, continue_final=True, add_generation_prompt=True)
    with pytest.raises(APIError, match="add_generation_prompt and continue_final_message"):
        split_prefill(convo, True, continue_final=True)  # add_generation_prompt defaults to true
    # the implicit prefill wins over an explicit add_generation_prompt, as in llama-server
    assert split_prefill(convo, True, add_generation_prompt=True).prefill == "Once upon"
    # add_generation_prompt: false alone renders the conversation without a new turn
    plain = split_prefill([_msg("user", "hi")], True, add_generation_prompt=False)
    assert plain.prefill is None and not plain.add_generation_prompt


def _submit(s: Scheduler, prompt: list[int], n_predict: int) -> Collector:
    c = Collector()
    s.submit(s.next_task_id(), GenerationRequest(prompt_tokens=prompt, n_predict=n_predict), c)  # type: ignore[arg-type]
    return c


def test_without_continuous_batching_a_prompt_waits_for_generation() -> None:
    runner = FakeRunner(n_seq_max=2)
    s = Scheduler(runner, 2, cont_batching=False)
    first = _submit(s, [1, 2, 3], 4)
    s._drain_inbox(block=False)
    s._step()  # the first prompt
    second = _submit(s, [4, 5, 6], 4)
    run_until_idle(s)
    assert first.finished is not None and second.finished is not None
    mixed = [p for p in runner.plans if len({row.seq_id for row in p}) > 1]
    assert not mixed, "a prompt was decoded beside a generating slot"


def test_a_slot_context_cap_limits_each_slot() -> None:
    s = Scheduler(FakeRunner(n_ctx_seq=256, n_seq_max=2), 2, n_ctx_slot=32)
    assert s.n_ctx_slot == 32 and all(slot.n_ctx == 32 for slot in s.slots)
    assert Scheduler(FakeRunner(n_ctx_seq=16, n_seq_max=2), 2, n_ctx_slot=32).n_ctx_slot == 16


def test_kv_unified_per_slot_sizes_the_pool_without_c(model_file: str) -> None:
    from llamaserve.compose import context_size

    cfg = config_from_args(["-m", model_file, "--kv-unified-per-slot", "256", "-np", "2"], environ={})
    assert context_size(cfg, 8192) == 512
    assert context_size(replace(cfg, ctx_size=1024), 8192) == 1024
    assert context_size(replace(cfg, kv_unified_per_slot=0), 8192) == 8192
