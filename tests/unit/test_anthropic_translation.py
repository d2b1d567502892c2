"""Anthropic Messages without a model: the request translation, and the event stream on
synthetic chat chunks (tool calls, reasoning) fed to the official SDK through a mock transport.

tests/server/test_anthropic.py runs the SDK against the real server.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import anthropic
import httpx2
import pytest

from llamaserve.chat.parsed import ParsedMessage, ToolCall
from llamaserve.engine.types import Finished, Timings
from llamaserve.errors import APIError
from llamaserve.families.anthropic.protocol import CountTokensRequest, MessagesRequest
from llamaserve.families.anthropic.request import to_chat_request
from llamaserve.families.anthropic.serving import MessageStream, error_event, message_body
from llamaserve.families.chat.answers import ChatChoice, ChatChunk, ChatResult
from llamaserve.serving.generate import Usage


# ------------------------------------------------------------------ helpers
def request(**fields: Any) -> CountTokensRequest:
    fields.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return CountTokensRequest.model_validate(fields)


def sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


def mock_client(body: bytes, content_type: str) -> anthropic.Anthropic:
    # The SDK runs on httpx2 (a fork of httpx) and refuses httpx objects.
    def handler(req: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": content_type}, content=body)

    return anthropic.Anthropic(
        base_url="http://mock",
        api_key="k",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


def finished(stop_type: str = "eos", word: str = "") -> Finished:
    return Finished(
        stop_type=stop_type,
        stopping_word=word,
        n_prompt_tokens=20,
        n_cached=5,
        n_predicted=9,
        timings=Timings(),
        id_slot=0,
    )


USAGE = Usage(prompt_tokens=20, cached_tokens=5, completion_tokens=9)


def result(message: ParsedMessage, finish_reason: str, fin: Finished | None = None) -> ChatResult:
    """The chat pipeline's typed answer with one choice."""
    choice = ChatChoice(message, finish_reason, fin or finished(), None)
    return ChatResult([choice], USAGE, {}, None)


def agent_chunks() -> list[ChatChunk]:
    """Reasoning, then text, then two tool calls streamed in fragments."""
    return [
        ChatChunk(0, {"role": "assistant", "content": None}),
        ChatChunk(0, {"reasoning_content": "The user wants "}),
        ChatChunk(0, {"reasoning_content": "the weather."}),
        ChatChunk(0, {"content": "Let me check."}),
        ChatChunk(
            0,
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            },
        ),
        ChatChunk(0, {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        ChatChunk(0, {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        ChatChunk(
            0,
            {
                "tool_calls": [
                    {
                        "index": 1,
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_time", "arguments": "{}"},
                    }
                ]
            },
        ),
        ChatChunk(0, {}, finish_reason="tool_calls", timings={}),
        ChatChunk(-1, usage=USAGE),
    ]


def run_stream(
    chunks: list[ChatChunk], fin: Finished | None = None, stops: list[str] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    stream = MessageStream("test-model", 20, stops, msg_id="msg_test")
    events = stream.start()
    for chunk in chunks:
        if chunk.finish_reason and fin is not None:
            chunk = dataclasses.replace(chunk, finished=fin)  # the pipeline's last event of a choice
        events += stream.feed(chunk)
    return events + stream.finish(None)


def shape(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Event names, with the delta type for deltas and the block type for block starts."""
    out = []
    for name, data in events:
        assert data["type"] == name
        if name == "content_block_delta":
            out.append(f"delta:{data['index']}:{data['delta']['type']}")
        elif name == "content_block_start":
            out.append(f"start:{data['index']}:{data['content_block']['type']}")
        elif name == "content_block_stop":
            out.append(f"stop:{data['index']}")
        else:
            out.append(name)
    return out


# ------------------------------------------------- translation, no model
def test_request_translation_covers_blocks_tools_and_thinking() -> None:
    req = request(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Need the tool.", "signature": "sig"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                    {"type": "text", "text": "Thanks, and now?"},
                ],
            },
        ],
        tools=[
            {
                "name": "get_weather",
                "description": "Weather",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            }
        ],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 512},
        stop_sequences=["END"],
        max_tokens=16,
        temperature=0.5,
        top_k=7,
        metadata={"user_id": "u"},
        min_p=0.1,
        chat_template_kwargs={"foo": 1},
    )
    chat = to_chat_request(req)
    roles = [m.role for m in chat.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert chat.messages[0].content == [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}]
    assistant = chat.messages[2]
    assert assistant.content == "Checking."
    assert assistant.reasoning_content == "Need the tool."
    assert assistant.tool_calls == [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    assert chat.messages[3].tool_call_id == "toolu_1" and chat.messages[3].content == "Sunny"
    assert chat.messages[4].content == "Thanks, and now?"
    assert chat.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is False
    assert chat.chat_template_kwargs == {"foo": 1, "enable_thinking": True}
    assert chat.reasoning_budget_tokens == 512
    assert chat.stop == ["END"] and chat.max_tokens == 16 and chat.n == 1
    assert chat.temperature == 0.5 and chat.top_k == 7 and chat.min_p == 0.1
    assert "metadata" not in (chat.model_extra or {})


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_tool_choice_mapping(choice: dict[str, Any], expected: Any) -> None:
    chat = to_chat_request(request(tools=[{"name": "f", "input_schema": {"type": "object"}}], tool_choice=choice))
    assert chat.tool_choice == expected
    assert chat.parallel_tool_calls is None


def test_tool_only_assistant_turn_has_null_content() -> None:
    chat = to_chat_request(
        request(
            messages=[
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]},
            ]
        )
    )
    assert chat.messages[1].content is None and chat.messages[1].tool_calls
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool"]


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f1"}}],
                    }
                ]
            },
            "image source type must be 'base64' or 'url'",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
        ({"tool_choice": {"type": "tool"}, "tools": [{"name": "f"}]}, "requires a 'name'"),
        ({"tool_choice": {"type": "any"}}, "requires tools"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "tool_use_id"),
        ({"system": [{"type": "image"}]}, "only text blocks"),
    ],
)
def test_unsupported_input_is_a_clear_error(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(APIError) as info:
        to_chat_request(request(**fields))
    assert needle in info.value.message and info.value.status == 400


def test_image_blocks_become_image_url_parts_in_order() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    content = [{"type": "text", "text": "a"}, image, url]
    chat = to_chat_request(request(messages=[{"role": "user", "content": content}]))
    assert chat.messages[0].content == [
        {"type": "text", "text": "a"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
    ]


def test_thinking_disabled_and_output_config() -> None:
    chat = to_chat_request(
        request(
            thinking={"type": "disabled"},
            output_config={"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}},
        )
    )
    assert chat.chat_template_kwargs == {"enable_thinking": False}
    assert chat.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": {"type": "object"}},
    }
    assert chat.reasoning_effort == "low"


def test_max_tokens_is_required_for_messages_only() -> None:
    with pytest.raises(Exception, match="max_tokens"):
        MessagesRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert CountTokensRequest.model_validate({"messages": [{"role": "user", "content": "x"}]}).max_tokens is None


# --------------------------------------------------- responses, no model
def test_message_body_from_tool_calls_and_reasoning() -> None:
    message = ParsedMessage(content="", reasoning="think", tool_calls=[ToolCall("f", '{"a": 1}', "call_1")])
    body = message_body("m", result(message, "tool_calls"), None, msg_id="msg_x")
    assert [b["type"] for b in body["content"]] == ["thinking", "tool_use"]
    assert body["content"][0]["signature"]
    assert body["content"][1] == {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}
    assert body["stop_reason"] == "tool_use" and body["stop_sequence"] is None
    assert body["usage"] == {
        "input_tokens": 15,
        "output_tokens": 9,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 5,
    }
    msg = mock_client(json.dumps(body).encode(), "application/json").messages.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "x"}]
    )
    assert msg.content[0].type == "thinking" and msg.content[0].thinking == "think"
    assert msg.content[1].type == "tool_use" and msg.content[1].input == {"a": 1}


@pytest.mark.parametrize(
    ("finish", "fin", "stops", "expected"),
    [
        ("length", finished("limit"), None, ("max_tokens", None)),
        ("stop", finished("eos"), None, ("end_turn", None)),
        ("stop", finished("word", "END"), ["END"], ("stop_sequence", "END")),
        ("stop", finished("word", "</tool>"), ["END"], ("end_turn", None)),  # a format's own stop string
    ],
)
def test_stop_reason(finish: str, fin: Finished, stops: list[str] | None, expected: tuple[str, Any]) -> None:
    body = message_body("m", result(ParsedMessage(content="hi"), finish, fin), stops)
    assert (body["stop_reason"], body["stop_sequence"]) == expected


def test_truncated_tool_call_reports_max_tokens() -> None:
    message = ParsedMessage(tool_calls=[ToolCall("f", '{"a"', "c")])
    body = message_body("m", result(message, "length", finished("limit")), None)
    assert body["stop_reason"] == "max_tokens"


def test_stream_events_for_thinking_text_and_tools() -> None:
    events = run_stream(agent_chunks())
    assert shape(events) == [
        "message_start",
        "ping",
        "start:0:thinking",
        "delta:0:thinking_delta",
        "delta:0:thinking_delta",
        "delta:0:signature_delta",
        "stop:0",
        "start:1:text",
        "delta:1:text_delta",
        "stop:1",
        "start:2:tool_use",
        "delta:2:input_json_delta",
        "delta:2:input_json_delta",
        "stop:2",
        "start:3:tool_use",
        "delta:3:input_json_delta",
        "stop:3",
        "message_delta",
        "message_stop",
    ]
    starts = {d["index"]: d["content_block"] for n, d in events if n == "content_block_start"}
    assert starts[2] == {"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}}
    assert starts[0] == {"type": "thinking", "thinking": "", "signature": ""}
    delta = next(d for n, d in events if n == "message_delta")
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 9
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] == 20


def test_sdk_accumulates_the_synthetic_stream() -> None:
    client = mock_client(sse(run_stream(agent_chunks())), "text/event-stream")
    with client.messages.stream(model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert "thinking" in kinds and "text" in kinds and "input_json" in kinds
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert final.content[0].thinking == "The user wants the weather." and final.content[0].signature
    assert final.content[1].text == "Let me check."
    assert (final.content[2].name, final.content[2].input) == ("get_weather", {"city": "Paris"})
    assert (final.content[3].id, final.content[3].input) == ("call_b", {})
    assert final.stop_reason == "tool_use"
    assert final.usage.output_tokens == 9 and final.usage.cache_read_input_tokens == 5


def test_stream_stop_sequence_and_empty_answer() -> None:
    chunks = [
        ChatChunk(0, {"role": "assistant", "content": None}),
        ChatChunk(0, {}, finish_reason="stop"),
        ChatChunk(-1, usage=USAGE),
    ]
    events = run_stream(chunks, finished("word", "END"), ["END"])
    assert shape(events) == ["message_start", "ping", "start:0:text", "stop:0", "message_delta", "message_stop"]
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_error_event_is_anthropic_shaped() -> None:
    frame = error_event(APIError("Loading model", "unavailable_error"))
    assert frame.startswith(b"event: error\ndata: ") and frame.endswith(b"\n\n")
    body = json.loads(frame.split(b"data: ", 1)[1])
    assert body == {"type": "error", "error": {"type": "overloaded_error", "message": "Loading model"}}


@pytest.fixture(scope="module")
def client(base_url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key="none", max_retries=0, timeout=120)


def hi(text: str = "Hi") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]
