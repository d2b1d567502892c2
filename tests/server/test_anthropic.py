"""Anthropic Messages against the real server: /v1/messages and /v1/messages/count_tokens
through the official SDK on SmolLM2 (plain text: it has no tools and no reasoning).

The request translation and the event stream are tested without a model in
tests/unit/test_anthropic_translation.py.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from llamaserve.families.anthropic.protocol import CountTokensRequest

GREEDY = {"temperature": 0.0}


# ------------------------------------------------------------------ helpers
def request(**fields: Any) -> CountTokensRequest:
    fields.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return CountTokensRequest.model_validate(fields)


USAGE = {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29, "prompt_tokens_details": {"cached_tokens": 5}}


# ------------------------------------------------------------ real server
@pytest.fixture(scope="module")
def client(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="none", max_retries=0, timeout=120)


def hi(text: str = "Hi") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_create_message(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(model="any", max_tokens=16, messages=hi(), system="You are brief.", extra_body=GREEDY)
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.content[0].type == "text" and msg.content[0].text.strip()
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    assert 0 < msg.usage.output_tokens <= 16
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 5
    assert msg.usage.cache_creation_input_tokens == 0


def test_stream_matches_create(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model="m", max_tokens=12, messages=hi("Name a color."), extra_body=GREEDY)
    with client.messages.stream(model="m", max_tokens=12, messages=hi("Name a color."), extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_raw_stream_event_sequence(base_url: str) -> None:
    body = {"model": "m", "max_tokens": 6, "stream": True, "messages": hi(), **GREEDY}
    names: list[str] = []
    datas: list[dict[str, Any]] = []
    with httpx.stream(
        "POST",
        f"{base_url}/v1/messages",
        json=body,
        timeout=120,
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
            elif line.startswith("data: "):
                datas.append(json.loads(line[6:]))
    assert [d["type"] for d in datas] == names
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(
        d["index"] == 0 and d["delta"]["type"] == "text_delta" for d in datas if d["type"] == "content_block_delta"
    )
    assert datas[-2]["delta"]["stop_reason"] == "max_tokens" and datas[-2]["usage"]["output_tokens"] == 6


def test_stop_sequence(client: anthropic.Anthropic) -> None:
    messages = hi("Count: one, two, three, four")
    free = client.messages.create(model="m", max_tokens=16, messages=messages, extra_body=GREEDY)
    text = free.content[0].text
    assert "Two" in text, text
    msg = client.messages.create(
        model="m", max_tokens=16, messages=messages, stop_sequences=["Two", "zzz"], extra_body=GREEDY
    )
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "Two")
    assert msg.content[0].text == text[: text.index("Two")]
    with client.messages.stream(
        model="m", max_tokens=16, messages=messages, stop_sequences=["Two"], extra_body=GREEDY
    ) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "Two")


def test_count_tokens_matches_the_real_prompt(client: anthropic.Anthropic) -> None:
    kwargs: dict[str, Any] = {"messages": hi("Tell me a joke."), "system": [{"type": "text", "text": "Be funny."}]}
    counted = client.messages.count_tokens(model="m", **kwargs)
    msg = client.messages.create(model="m", max_tokens=1, extra_body=GREEDY, **kwargs)
    assert counted.input_tokens == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)
    with_tools = client.messages.count_tokens(
        model="m",
        tools=[{"name": "get_weather", "description": "Get the weather", "input_schema": {"type": "object"}}],
        **kwargs,
    )
    assert with_tools.input_tokens >= counted.input_tokens


def test_tool_history_and_thinking_replay_are_accepted(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model="m",
        max_tokens=4,
        extra_body=GREEDY,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "abc"},
                    {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny"}]},
        ],
    )
    assert msg.content and msg.usage.output_tokens <= 4


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}).encode(), "max_tokens"),
        (b"{not json", "not valid JSON"),
        (b"", "empty"),
        (json.dumps({"model": "m", "max_tokens": 4, "messages": []}).encode(), "messages"),
        (
            json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}).encode(),
            "role",
        ),
        (
            json.dumps(
                {
                    "model": "m",
                    "max_tokens": 4,
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}],
                        }
                    ],
                }
            ).encode(),
            "image",
        ),
    ],
)
def test_errors_use_the_anthropic_envelope(base_url: str, raw: bytes, needle: str) -> None:
    r = httpx.post(
        f"{base_url}/v1/messages",
        content=raw,
        timeout=60,
        headers={"content-type": "application/json", "x-api-key": "k", "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert needle in body["error"]["message"]


def test_sdk_raises_typed_errors(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="m", max_tokens=4, messages=[])
    assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with (
        pytest.raises(anthropic.BadRequestError),
        client.messages.stream(model="m", max_tokens=4, messages=hi("word " * 3000)) as s,
    ):
        list(s)


def test_count_tokens_errors_are_anthropic_shaped(base_url: str) -> None:
    r = httpx.post(f"{base_url}/v1/messages/count_tokens", json={"model": "m"}, timeout=60)
    assert r.status_code == 400 and r.json()["type"] == "error"
