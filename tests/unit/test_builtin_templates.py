"""llama.cpp's built-in chat templates (--chat-template llama3, gemma, ...): rendered by llama.cpp
through ctypes, selected by exact name, everything else still inline Jinja."""

from __future__ import annotations

from typing import Any

import pytest

from llamaserve.chat.builtin_template import BuiltinTemplate
from llamaserve.chat.template import CHATML_TEMPLATE, ChatTemplate, TemplateError
from llamaserve.compose import _builtin_name, _chat_template
from llamaserve.config import ServerConfig, embedded_default_model
from llamaserve.llama.builtin_templates import BuiltinTemplateError, builtin_template_names, render_builtin
from llamaserve.llama.model import Model

TWO = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}]

# The prompt each family makes of TWO plus the generation prompt, as llama.cpp writes it.
EXPECTED = {
    "llama3": "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral-v7": "[INST] Hello[/INST] Hi there</s>",
    "gemma": "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n"
    "<start_of_turn>model\n",
    "phi4": "<|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|>"
    "<|im_start|>assistant<|im_sep|>",
    "command-r": "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
    "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "zephyr": "<|user|>\nHello<|endoftext|>\n<|assistant|>\nHi there<|endoftext|>\n<|assistant|>\n",
}


def builtin(name: str) -> BuiltinTemplate:
    return BuiltinTemplate(name, render_builtin)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_family_writes_its_own_markers(name: str) -> None:
    assert builtin(name).render(TWO, add_generation_prompt=True) == EXPECTED[name]


def test_every_listed_name_renders() -> None:
    names = builtin_template_names()
    assert {"chatml", "llama3", "mistral-v7", "gemma", "phi4", "command-r", "zephyr"} <= set(names)
    conversation = [{"role": "system", "content": "Be brief."}, *TWO, {"role": "user", "content": "Again"}]
    for name in names:
        prompt = builtin(name).render(conversation, add_generation_prompt=True)
        assert "Again" in prompt, name


def test_a_long_prompt_grows_the_buffer() -> None:
    text = "x" * 5000 + "END"
    prompt = render_builtin("llama3", [("user", text)], True)
    assert prompt.endswith(f"{text}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")


def test_an_unknown_name_is_an_error_at_the_native_layer() -> None:
    with pytest.raises(BuiltinTemplateError):
        render_builtin("no-such-template", [("user", "hi")], True)


def test_messages_are_flattened_like_llama_server() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "result"},
    ]
    prompt = builtin("llama3").render(messages, add_generation_prompt=False, enable_thinking=False)
    assert prompt == (
        "<|start_header_id|>user<|end_header_id|>\n\na\nb<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<|eot_id|>"
        "<|start_header_id|>tool<|end_header_id|>\n\nresult<|eot_id|>"
    )


def test_tools_are_refused_with_a_clear_message() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(TemplateError, match="tools need a Jinja chat template"):
        builtin("gemma").render(TWO, tools=[tool])
    assert not builtin("gemma").caps.supports_tools
    assert not builtin("gemma").caps.supports_thinking


def test_our_chatml_renders_what_llama_cpp_does() -> None:
    # --chat-template chatml keeps our Jinja ChatML; for plain messages it is llama.cpp's too.
    conversation = [{"role": "system", "content": "S"}, *TWO, {"role": "user", "content": "Q"}]
    for gen in (True, False):
        jinja = ChatTemplate(CHATML_TEMPLATE).render(conversation, add_generation_prompt=gen)
        assert jinja == builtin("chatml").render(conversation, add_generation_prompt=gen)


def config(chat_template: str) -> ServerConfig:
    path = embedded_default_model()
    assert path
    return ServerConfig(model=path, chat_template=chat_template)


def test_selection_is_by_exact_name(model: Model) -> None:
    assert _builtin_name(config(chat_template="llama3")) == "llama3"
    for not_a_name in ("Llama3", " llama3", "llama-3", "chatml", "{{ messages[0]['content'] }}"):
        assert _builtin_name(config(chat_template=not_a_name)) is None, not_a_name
    template, source = _chat_template(config(chat_template="mistral-v7"), model)
    assert isinstance(template, BuiltinTemplate)
    assert source == "mistral-v7"  # what /props shows, as llama-server does


def test_an_unknown_name_is_inline_jinja(model: Model) -> None:
    template, source = _chat_template(config(chat_template="llama-3"), model)
    assert isinstance(template, ChatTemplate)
    assert source == "llama-3"
    assert template.render(TWO) == "llama-3"  # Jinja text without tags renders as itself
