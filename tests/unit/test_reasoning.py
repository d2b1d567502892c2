"""Reasoning split (llamaserve.chat.reasoning): llama-server's reasoning formats, prompts that
open the thinking block themselves, and streaming that equals the one-shot split."""

from __future__ import annotations

import random

import pytest

from llamaserve.chat.parsed import ContentDelta, ReasoningDelta
from llamaserve.chat.reasoning import (
    ReasoningSplitter,
    split_reasoning,
    template_opens_thinking,
)
from llamaserve.chat.tools import fold
from tests.llama_cpp_files import read_template


def stream_split(text: str, pieces: list[str], **kw: object) -> tuple[str, str]:
    s = ReasoningSplitter(**kw)  # type: ignore[arg-type]
    events = []
    for p in pieces:
        events += s.feed(p)
    events += s.finish()
    assert all(isinstance(e, (ContentDelta, ReasoningDelta)) and e.text for e in events)
    msg = fold(events)
    return msg.reasoning, msg.content


def all_splits(text: str) -> list[list[str]]:
    out = [[text[:k], text[k:]] for k in range(len(text) + 1)]
    out.append(list(text))
    rng = random.Random(7)
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, len(text)), min(4, len(text) - 1))) if len(text) > 2 else []
        prev, pieces = 0, []
        for c in cuts + [len(text)]:
            pieces.append(text[prev:c])
            prev = c
        out.append(pieces)
    return out


# (text, started_in_prompt, expected deepseek (reasoning, content))
CASES = [
    ("<think>I should greet.</think>Hello!", False, ("I should greet.", "Hello!")),
    ("<think>\nStep 1.\nStep 2.\n</think>\n\nThe answer is 4.", False, ("Step 1.\nStep 2.", "The answer is 4.")),
    ("  \n<think>x</think>y", False, ("x", "y")),
    ("<think></think>Just the answer.", False, ("", "Just the answer.")),
    ("No reasoning here.", False, ("", "No reasoning here.")),
    ("  leading spaces kept", False, ("", "  leading spaces kept")),
    ("The tag <think>later</think> is content.", False, ("", "The tag <think>later</think> is content.")),
    (
        "<think>Unterminated thoughts, cut off by max_tokens ",
        False,
        ("Unterminated thoughts, cut off by max_tokens", ""),
    ),
    ("[THINK]Magistral style.[/THINK]Answer.", False, ("Magistral style.", "Answer.")),
    ("<seed:think>Seed.</seed:think>Out.", False, ("Seed.", "Out.")),
    ("<think>a</think> b </think> c", False, ("a", "b </think> c")),
    # the template opened <think> in the generation prompt
    ("Let me think.\n</think>\n\nDone.", True, ("Let me think.", "Done.")),
    ("<think>\nRepeated opener.</think>Done.", True, ("Repeated opener.", "Done.")),
    ("\n</think>\n\nNo thinking at all.", True, ("", "No thinking at all.")),
    ("Still thinking when the budget ran out", True, ("Still thinking when the budget ran out", "")),
    ("<", False, ("", "<")),
    ("<thin", False, ("", "<thin")),
    ("", False, ("", "")),
    ("", True, ("", "")),
]


@pytest.mark.parametrize(("text", "started", "expected"), CASES)
def test_deepseek_split(text: str, started: bool, expected: tuple[str, str]) -> None:
    assert split_reasoning(text, fmt="deepseek", started_in_prompt=started) == expected
    assert split_reasoning(text, fmt="auto", started_in_prompt=started) == expected


@pytest.mark.parametrize(("text", "started", "expected"), CASES)
def test_none_keeps_everything_as_content(text: str, started: bool, expected: tuple[str, str]) -> None:
    assert split_reasoning(text, fmt="none", started_in_prompt=started) == ("", text)
    for pieces in all_splits(text)[:5]:
        assert stream_split(text, pieces, fmt="none", started_in_prompt=started) == ("", text)


@pytest.mark.parametrize(("text", "started", "expected"), CASES)
def test_legacy_fills_both(text: str, started: bool, expected: tuple[str, str]) -> None:
    reasoning, content = split_reasoning(text, fmt="deepseek-legacy", started_in_prompt=started)
    assert reasoning == expected[0]
    assert content == (("<think>" if started and text else "") + text)


@pytest.mark.parametrize("fmt", ["deepseek", "deepseek-legacy", "none"])
@pytest.mark.parametrize(("text", "started", "expected"), CASES)
def test_streaming_equals_one_shot(fmt: str, text: str, started: bool, expected: tuple[str, str]) -> None:
    whole = split_reasoning(text, fmt=fmt, started_in_prompt=started)
    for pieces in all_splits(text):
        assert stream_split(text, pieces, fmt=fmt, started_in_prompt=started) == whole, pieces


def test_partial_markers_are_held_back() -> None:
    s = ReasoningSplitter("deepseek")
    assert s.feed("  <thi") == []
    assert fold(s.feed("nk>Hmm")).reasoning == "Hmm"
    assert s.feed(" ok </th") == [ReasoningDelta(" ok")]
    assert fold(s.feed("ink>\nAnswer")).content == "Answer"
    s = ReasoningSplitter("deepseek")
    assert s.feed("<thi") == []
    assert fold(s.feed("s is not a tag")).content == "<this is not a tag"


def test_reasoning_streams_before_the_block_closes() -> None:
    s = ReasoningSplitter("deepseek", started_in_prompt=True)
    assert fold(s.feed("First step. ")).reasoning == "First step."
    assert fold(s.feed("Second")).reasoning == " Second"


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValueError):
        split_reasoning("x", fmt="bogus")


def test_custom_markers() -> None:
    markers = (("<|START_THINKING|>", "<|END_THINKING|>"),)
    assert split_reasoning("<|START_THINKING|>a<|END_THINKING|>b", markers=markers) == ("a", "b")


def test_template_opens_thinking_on_prompts() -> None:
    assert template_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert template_opens_thinking("<｜Assistant｜><think>\n")
    assert template_opens_thinking("[THINK]")
    assert not template_opens_thinking("<|im_start|>assistant\n")
    assert not template_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not template_opens_thinking("<｜Assistant｜><think></think>")
    assert not template_opens_thinking("<assistant>\n</think>")


OPENS = {
    "Qwen3.5-4B.jinja": True,
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": True,
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": True,
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": False,  # closes it unless enable_thinking
    "llama-cpp-deepseek-r1.jinja": True,
    "GLM-4.7-Flash.jinja": True,
    "MiniMax-M2.jinja": True,
    "Qwen-Qwen2.5-7B-Instruct.jinja": False,
    "Qwen-Qwen3-0.6B.jinja": False,
    "deepseek-ai-DeepSeek-V3.1.jinja": False,
    "poolside-Laguna-XS-2.1.jinja": False,
    "Kimi-K2-Thinking.jinja": False,
    "ByteDance-Seed-OSS.jinja": False,
}


@pytest.mark.parametrize(("template", "expected"), sorted(OPENS.items()))
def test_template_opens_thinking_on_real_templates(template: str, expected: bool) -> None:
    from llamaserve.chat.template import ChatTemplate

    t = ChatTemplate(read_template(template), bos_token="<s>", eos_token="</s>")
    prompt = t.generation_prompt([{"role": "user", "content": "Hi"}])
    assert template_opens_thinking(prompt) is expected, prompt
    if template == "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja":
        prompt = t.generation_prompt([{"role": "user", "content": "Hi"}], enable_thinking=True)
        assert template_opens_thinking(prompt)
