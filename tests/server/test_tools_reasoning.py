"""Tool calling on Qwen2.5-Coder (Hermes-style <tool_call>) and reasoning extraction."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import openai
import pytest

from tests.models.packaged import qwen_coder

from .conftest import RunningServer, start_server, stop_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
    },
}


@pytest.fixture(scope="module")
def coder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(["-m", str(qwen_coder()), "-np", "2", "-c", "4096", "-t", "2"], tmp_path_factory.mktemp("coder"))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(coder: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{coder.url}/v1", api_key="none", max_retries=0, timeout=300)


ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def test_required_tool_choice_gives_a_valid_call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=60, temperature=0
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert calls and calls[0].function.name in ("get_weather", "get_time")
    args = json.loads(calls[0].function.arguments)
    assert isinstance(args, dict)
    if calls[0].function.name == "get_weather":
        assert isinstance(args["city"], str) and set(args) <= {"city", "unit"}
    assert re.fullmatch(r"[A-Za-z0-9]{9}", calls[0].id)


def test_named_tool_choice_forces_that_tool(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER, TIME],
        max_tokens=60,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    calls = r.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_time"]
    assert "timezone" in json.loads(calls[0].function.arguments)


def test_streamed_tool_calls_equal_the_non_streamed_ones(client: openai.OpenAI) -> None:
    kw = dict(model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=60, temperature=0)
    whole = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    chunks = list(client.chat.completions.create(stream=True, **kw))  # type: ignore[call-overload]
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(tc.index, {"name": "", "arguments": "", "id": ""})
            if tc.id:
                assert not entry["id"], "id only in the first delta of a call"
                entry["id"] = tc.id
                assert tc.function is not None and tc.function.name and tc.type == "function"
                entry["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                entry["arguments"] += tc.function.arguments
    expected = whole.choices[0].message.tool_calls or []
    assert [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)] == [
        (c.function.name, json.loads(c.function.arguments)) for c in expected
    ]
    assert min(calls) == 0
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


def test_tool_result_round_trip(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=60, temperature=0
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21, "sky": "sunny"}'},
    ]
    r = client.chat.completions.create(model="m", messages=history, tools=[WEATHER], max_tokens=40, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.choices[0].message.content or r.choices[0].message.tool_calls


def test_tool_choice_none_and_bad_tool_choice(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Say hi."}],
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=8,
        temperature=0,
    )
    assert not r.choices[0].message.tool_calls
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=ASK, tool_choice="required", max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="m",
            messages=ASK,
            tools=[WEATHER],
            tool_choice="sometimes",  # type: ignore[arg-type]
            max_tokens=4,
        )


def test_reasoning_is_split_from_the_answer(base_url: str) -> None:
    """No small reasoning model is packaged: a grammar makes SmolLM2 write <think>…</think>answer."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=120)
    grammar = 'root ::= "<think>" [a-z ]{3,30} "</think>" [A-Za-z ]{1,20}'
    kw = dict(
        model="m",
        messages=[{"role": "user", "content": "Think, then answer: what color is the sky?"}],
        max_tokens=40,
        temperature=0,
        extra_body={"grammar": grammar, "reasoning_format": "deepseek"},
    )
    r = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    msg = r.choices[0].message
    reasoning = (msg.model_extra or {}).get("reasoning_content")
    assert reasoning and "<think>" not in (msg.content or "") and "</think>" not in reasoning
    assert msg.content
    chunks = list(client.chat.completions.create(stream=True, **kw))  # type: ignore[call-overload]
    streamed_reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
    )
    streamed_content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed_reasoning == reasoning and streamed_content == msg.content
    legacy = client.chat.completions.create(
        **{
            **kw,
            "extra_body": {  # type: ignore[call-overload]
                "grammar": grammar,
                "reasoning_format": "none",
            },
        }
    )
    assert (legacy.choices[0].message.content or "").startswith("<think>")
