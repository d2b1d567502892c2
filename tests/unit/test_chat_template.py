"""Chat template rendering: the 70 real templates, tool-call round trips, the sandbox, errors.

No model is needed; everything here is string rendering.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest
from jinja2.exceptions import SecurityError

from llamaserve.chat.template import (
    CHATML_TEMPLATE,
    ChatTemplate,
    TemplateCaps,
    TemplateError,
    normalize_messages,
)
from tests.llama_cpp_files import TEMPLATES, read_template, template_names

# llama.cpp's template corpus (models/templates), which scripts/bootstrap copies from the sdist.
TEMPLATE_NAMES = template_names()

# Templates that refuse a system message, with the refusal they give.
SYSTEM_REJECTING = {"google-gemma-2-2b-it.jinja": "System role not supported"}

SYSTEM_TEXT = "You are a terse assistant."
USER_TEXT = "What is the capital of France?"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name."}},
            "required": ["city"],
        },
    },
}


def tool_round_trip() -> list[dict[str, Any]]:
    """user -> assistant tool call (content null, arguments as a JSON string) -> tool result."""
    return [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call0a1B2",  # 9 alphanumerics: Mistral-style templates insist
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call0a1B2",
            "name": "get_weather",
            "content": "Sunny, 24 degrees",
        },
    ]


def load(name: str, **tokens: str) -> ChatTemplate:
    return ChatTemplate(read_template(name), **tokens)


# ---------------------------------------------------------------------------------------------
# Every real template
# ---------------------------------------------------------------------------------------------


def test_template_corpus_is_present() -> None:
    assert TEMPLATES.is_dir(), f"missing test data: {TEMPLATES} (scripts/bootstrap copies it from the sdist)"
    assert len(TEMPLATE_NAMES) >= 70


@pytest.mark.parametrize("name", TEMPLATE_NAMES)
def test_real_template_renders_basic_conversation(name: str) -> None:
    chat = load(name, bos_token="<s>", eos_token="</s>")
    conversation = [
        {"role": "system", "content": SYSTEM_TEXT},
        {"role": "user", "content": USER_TEXT},
    ]
    try:
        prompt = chat.render(conversation, add_generation_prompt=True)
    except TemplateError as exc:
        # Only the known system-refusing templates may fail, and with their own clear words.
        assert name in SYSTEM_REJECTING, f"unexpected failure: {exc}"
        assert exc.message == SYSTEM_REJECTING[name]
        assert exc.raised_by_template
        prompt = chat.render(conversation[1:], add_generation_prompt=True)
        assert not chat.caps.supports_system_role
    else:
        assert name not in SYSTEM_REJECTING
        assert SYSTEM_TEXT in prompt
    assert USER_TEXT in prompt
    # Whatever the template, the capability probes must complete and report plain booleans.
    caps = chat.caps
    assert isinstance(caps, TemplateCaps)
    props = caps.to_props()
    assert set(props) == {
        "supports_tools",
        "supports_tool_calls",
        "supports_system_role",
        "supports_parallel_tool_calls",
        "supports_preserve_reasoning",
        "supports_string_content",
        "supports_typed_content",
        "supports_object_arguments",
    }
    assert all(isinstance(v, bool) for v in props.values())
    assert caps.supports_string_content or caps.supports_typed_content


# ---------------------------------------------------------------------------------------------
# Tool calls
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    ],
)
def test_tool_round_trip_hermes_style(name: str) -> None:
    template = load(name)
    messages = tool_round_trip()
    prompt = template.render(messages, tools=[WEATHER_TOOL])
    # Arguments arrived as a JSON string and are rendered as a JSON object (parsed, then
    # ``tojson``): not double-encoded, not a Python repr.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in (prompt)
    assert "<tool_response>\nSunny, 24 degrees\n</tool_response>" in prompt
    assert "Get the current weather in a city." in prompt  # the tool schema is in the prompt
    assert "None" not in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    # The caller's messages are untouched (arguments still a string).
    assert messages == tool_round_trip()


def test_tool_round_trip_llama31() -> None:
    template = load(
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
    )
    prompt = template.render(tool_round_trip(), tools=[WEATHER_TOOL])
    assert prompt.startswith("<|begin_of_text|>")
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in prompt
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"Sunny, 24 degrees"<|eot_id|>' in prompt
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_llama31_rejects_parallel_calls_with_its_message() -> None:
    template = load("meta-llama-Llama-3.1-8B-Instruct.jinja")
    assert not template.caps.supports_parallel_tool_calls
    messages = tool_round_trip()
    messages[1]["tool_calls"] = messages[1]["tool_calls"] * 2
    with pytest.raises(TemplateError, match="only supports single tool-calls"):
        template.render(messages, tools=[WEATHER_TOOL])


def test_kimi_k2_tool_call_id_queue_works() -> None:
    # Kimi-K2 keeps tool-call ids in a list with .append()/.pop(0), which the stock immutable
    # sandbox refuses; ours allows list mutation on per-render copies.
    template = load("Kimi-K2-Instruct.jinja")
    messages = tool_round_trip()
    prompt = template.render(messages, tools=[WEATHER_TOOL])
    assert "Sunny, 24 degrees" in prompt
    assert messages == tool_round_trip()


def test_qwen3_null_content_is_rendered_as_empty() -> None:
    # Qwen3 evaluates ``'</think>' in message.content``, which fails on null content; the
    # template is detected as needing "" instead.
    template = load("Qwen-Qwen3-0.6B.jinja")
    assert template.caps.requires_non_null_content
    prompt = template.render(tool_round_trip(), tools=[WEATHER_TOOL])
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    assert "Sunny, 24 degrees" in prompt


def test_string_only_arguments_are_not_parsed() -> None:
    # DeepSeek-R1-Distill-Llama concatenates ``arguments`` as a string: parsing it into a dict
    # would break the render, so for this template arguments stay strings.
    template = load("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")
    assert template.caps.supports_tool_calls
    assert not template.caps.supports_object_arguments
    prompt = template.render(tool_round_trip())
    assert '```json\n{"city": "Paris"}\n```' in prompt
    assert "Sunny, 24 degrees" in prompt


def test_tools_absent_means_undefined() -> None:
    template = ChatTemplate("{% if tools is defined %}T{{ tools | length }}{% else %}none{% endif %}")
    assert template.render([]) == "none"
    assert template.render([], tools=[]) == "none"
    assert template.render([], tools=[WEATHER_TOOL]) == "T1"


# ---------------------------------------------------------------------------------------------
# Errors and the sandbox
# ---------------------------------------------------------------------------------------------


def test_raise_exception_becomes_template_error_with_its_message() -> None:
    template = ChatTemplate(
        "{% if messages[0].role != 'user' %}"
        "{{ raise_exception('Conversation must start with a user message!') }}"
        "{% endif %}ok"
    )
    assert template.render([{"role": "user", "content": "hi"}]) == "ok"
    with pytest.raises(TemplateError) as info:
        template.render([{"role": "assistant", "content": "hi"}])
    assert info.value.message == "Conversation must start with a user message!"
    assert str(info.value) == "Conversation must start with a user message!"
    assert info.value.raised_by_template


def test_real_template_refusal_message() -> None:
    template = load("google-gemma-2-2b-it.jinja")
    with pytest.raises(TemplateError, match=r"^System role not supported$"):
        template.render([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])


@pytest.mark.parametrize(
    "payload",
    [
        "{{ lipsum.__globals__ }}",
        "{{ lipsum.__globals__['os'].popen('id').read() }}",
        "{{ lipsum.__globals__.os.popen('id').read() }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ joiner.__init__.__globals__ }}",
        "{{ namespace.__init__.__globals__ }}",
        "{{ raise_exception.__globals__['json'] }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ ''|attr('__class__') }}",
        "{{ '{0.__class__.__mro__}'.format('') }}",
        "{{ self.__init__.__globals__ }}",
        "{{ messages[0].update({'role': 'system'}) }}",
    ],
)
def test_sandbox_blocks_escape_payloads(payload: str) -> None:
    template = ChatTemplate(payload)
    with pytest.raises(TemplateError, match="unsafe") as info:
        template.render([{"role": "user", "content": "hi"}])
    assert isinstance(info.value.__cause__, SecurityError)
    assert not info.value.raised_by_template


def test_template_cannot_mutate_caller_data() -> None:
    messages = [{"role": "user", "content": "hi"}]
    tools = [WEATHER_TOOL]
    kwargs_list = [1, 2]
    template = ChatTemplate(
        "{% set _ = messages.pop() %}{% set _ = tools.append(1) %}{% set _ = extra.pop() %}"
        "{{ messages | length }}{{ tools | length }}{{ extra | length }}"
    )
    assert template.render(messages, tools=tools, extra=kwargs_list) == "021"
    assert messages == [{"role": "user", "content": "hi"}]
    assert tools == [WEATHER_TOOL]
    assert kwargs_list == [1, 2]


def test_syntax_error_raises_at_construction_with_line() -> None:
    with pytest.raises(TemplateError, match="syntax error at line 2"):
        ChatTemplate("ok\n{% for m in messages %}{{ m }}\n")


def test_runtime_errors_become_template_errors() -> None:
    cases = {
        "{{ messages[0].content + 1 }}": "TypeError",
        "{{ nothing.here }}": "UndefinedError",
        "\n\n{{ 1 // 0 }}": "at line 3: ZeroDivisionError",
        "{{ range(10**9) | list }}": "OverflowError",
    }
    for source, expected in cases.items():
        with pytest.raises(TemplateError, match=expected):
            ChatTemplate(source).render([{"role": "user", "content": "hi"}])


def test_reserved_names_cannot_be_overridden_by_kwargs() -> None:
    template = ChatTemplate("{{ messages | length }}|{{ bos_token }}|{{ add_generation_prompt }}")
    out = template.render(
        [{"role": "user", "content": "hi"}],
        add_generation_prompt=False,
        messages=[1, 2, 3],
        bos_token="X",
        add_generation_prompt_=True,
    )
    assert out == "1||False"


# ---------------------------------------------------------------------------------------------
# Globals, filters, kwargs
# ---------------------------------------------------------------------------------------------


def test_tojson_matches_transformers() -> None:
    value = {"b": "é<&>'", "a": [1, 2]}

    def render(source: str) -> str:
        return ChatTemplate(source).render([], value=value)

    assert render("{{ value | tojson }}") == '{"b": "é<&>\'", "a": [1, 2]}'
    assert render("{{ value | tojson(ensure_ascii=True) }}") == json.dumps(value)
    assert render("{{ value | tojson(indent=2) }}") == json.dumps(value, ensure_ascii=False, indent=2)
    assert render("{{ value | tojson(separators=(',', ':'), sort_keys=true) }}") == ('{"a":[1,2],"b":"é<&>\'"}')
    assert render("{{ missing | tojson }}") == "null"
    assert render("{{ value.a | map('string') | tojson }}") == '["1", "2"]'


def test_from_json_filter() -> None:
    template = ChatTemplate("{{ (s | from_json).city }}")
    assert template.render([], s='{"city": "Paris"}') == "Paris"


def test_strftime_now() -> None:
    out = ChatTemplate("{{ strftime_now('%Y-%m-%d') }}").render([])
    assert out == datetime.now().strftime("%Y-%m-%d")


def test_generation_tag_is_accepted() -> None:
    template = ChatTemplate("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}")
    assert template.render([{"role": "assistant", "content": "a"}]) == "[a]"


def test_python_string_methods_items_and_namespace() -> None:
    template = ChatTemplate(
        "{% set ns = namespace(n=0) %}"
        "{% for k, v in d | items %}{% set ns.n = ns.n + v %}{% endfor %}"
        "{{ ns.n }} {{ s.split(',')[1].strip() }} {{ s.startswith('a') }} "
        "{% for k, v in d.items() %}{{ k }}{% endfor %}"
    )
    assert template.render([], d={"x": 1, "y": 2}, s="a, b") == "3 b True xy"


def test_none_prints_as_empty() -> None:
    template = ChatTemplate("[{{ messages[0].content }}]")
    assert template.render([{"role": "assistant", "content": None}]) == "[]"


def test_chat_template_kwargs_reach_the_template() -> None:
    template = load("Qwen-Qwen3-0.6B.jinja")
    messages = [{"role": "user", "content": "hi"}]
    thinking = template.render(messages)
    no_thinking = template.render(messages, enable_thinking=False)
    assert thinking.endswith("<|im_start|>assistant\n")
    assert no_thinking.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert template.generation_prompt(messages, enable_thinking=False) == (
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


# ---------------------------------------------------------------------------------------------
# ChatML fallback
# ---------------------------------------------------------------------------------------------


def test_chatml_fallback_exact_output() -> None:
    template = ChatTemplate(CHATML_TEMPLATE)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}],
        },
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "user", "content": "Bye"},
    ]
    assert template.render(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi\nthere<|im_end|>\n"
        "<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert template.render(messages[:1], add_generation_prompt=False) == ("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert template.generation_prompt(messages) == "<|im_start|>assistant\n"


def test_chatml_caps() -> None:
    caps = ChatTemplate(CHATML_TEMPLATE).caps
    assert caps.supports_system_role
    assert caps.supports_string_content
    assert not caps.supports_tools
    assert not caps.supports_tool_calls
    assert not caps.supports_thinking


# ---------------------------------------------------------------------------------------------
# Capabilities of known templates
# ---------------------------------------------------------------------------------------------


def test_caps_of_known_templates() -> None:
    qwen25 = load("Qwen-Qwen2.5-7B-Instruct.jinja").caps
    assert qwen25.supports_tools and qwen25.supports_tool_calls
    assert qwen25.supports_parallel_tool_calls and qwen25.supports_object_arguments
    assert qwen25.supports_system_role and not qwen25.supports_thinking
    assert not qwen25.requires_non_null_content

    gemma2 = load("google-gemma-2-2b-it.jinja").caps
    assert not gemma2.supports_system_role and not gemma2.supports_tools

    qwen3 = load("Qwen-Qwen3-0.6B.jinja").caps
    assert qwen3.supports_thinking and qwen3.supports_tool_calls

    gpt_oss = load("openai-gpt-oss-120b.jinja").caps
    assert gpt_oss.supports_thinking and gpt_oss.supports_tool_calls

    typed_only = ChatTemplate("{% for m in messages %}{{ m.content[0].text }}{% endfor %}")
    assert typed_only.caps.supports_typed_content
    assert not typed_only.caps.supports_string_content
    # Content-part arrays are kept for such a template instead of being joined.
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert typed_only.render([{"role": "user", "content": parts}]) == "a"


# ---------------------------------------------------------------------------------------------
# normalize_messages
# ---------------------------------------------------------------------------------------------


def test_normalize_joins_text_parts_and_parses_arguments() -> None:
    original: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "thought",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
                {"id": "3", "type": "function", "function": {"name": "h", "arguments": "[1, 2]"}},
            ],
        },
    ]
    snapshot = json.loads(json.dumps(original))
    out = normalize_messages(original)
    assert out[0]["content"] == "a\nb"
    calls = out[1]["tool_calls"]
    assert calls[0]["function"]["arguments"] == {"x": 1}
    assert calls[1]["function"]["arguments"] == "not json"
    assert calls[2]["function"]["arguments"] == "[1, 2]"  # only objects replace the string
    assert out[1]["content"] is None
    assert out[1]["reasoning_content"] == "thought"
    assert original == snapshot  # a deep copy: the input is untouched


def test_normalize_options() -> None:
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "x"}}]
    message = [{"role": "user", "content": parts}]
    with pytest.raises(TemplateError, match="unsupported content part type: 'image_url'"):
        normalize_messages(message)
    # llama-server's joining: a newline between text parts, none next to a media marker; content
    # with media is one string even for templates that take typed parts.
    assert normalize_messages(message, media_marker="<__media__>")[0]["content"] == "look<__media__>"
    assert normalize_messages(message, concat_text_parts=False, media_marker="<m>")[0]["content"] == "look<m>"
    more = [{"role": "user", "content": [*parts, {"type": "text", "text": "then"}, {"type": "text", "text": "more"}]}]
    assert normalize_messages(more, media_marker="<m>")[0]["content"] == "look<m>then\nmore"
    null = [{"role": "assistant", "content": None}]
    assert normalize_messages(null, null_content_as_empty=True)[0]["content"] == ""
    call = {"function": {"name": "f", "arguments": '{"x": 1}'}}
    unparsed = normalize_messages([{"role": "assistant", "tool_calls": [call]}], parse_arguments=False)
    assert unparsed[0]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'
    with pytest.raises(TemplateError, match="needs a string 'text'"):
        normalize_messages([{"role": "user", "content": [{"type": "text", "text": 5}]}])


def test_media_marker_is_a_template_setting() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    with pytest.raises(TemplateError, match="unsupported content part type"):
        ChatTemplate(CHATML_TEMPLATE).render(messages)
    prompt = ChatTemplate(CHATML_TEMPLATE, media_marker="<__media__>").render(messages)
    assert "<|im_start|>user\nWhat is this?<__media__><|im_end|>\n" in prompt  # no newline next to it
