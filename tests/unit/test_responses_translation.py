"""OpenAI Responses without a model: the request translation, and the event stream on
synthetic chat chunks (tool calls, reasoning) fed to the official SDK through a mock transport.

tests/server/test_responses.py runs the SDK against the real server.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest

from llamaserve.chat.parsed import ParsedMessage, ToolCall
from llamaserve.errors import APIError
from llamaserve.families.chat.answers import ChatChunk
from llamaserve.families.responses.input import to_chat_request
from llamaserve.families.responses.protocol import ResponsesRequest
from llamaserve.families.responses.serving import ResponseStream, envelope, finish, output_items
from llamaserve.serving.generate import Usage

GREEDY = {"temperature": 0.0}
USAGE = Usage(prompt_tokens=20, cached_tokens=5, completion_tokens=9)


# ------------------------------------------------------------------ helpers
def request(**fields: Any) -> ResponsesRequest:
    fields.setdefault("input", "Hi")
    return ResponsesRequest.model_validate(fields)


def sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


def mock_client(body: bytes, content_type: str) -> openai.OpenAI:
    # The SDK runs on httpx2 (a fork of httpx) and refuses httpx objects.
    def handler(req: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": content_type}, content=body)

    return openai.OpenAI(
        base_url="http://mock/v1",
        api_key="k",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
    )


def agent_chunks(finish_reason: str = "tool_calls") -> list[ChatChunk]:
    return [
        ChatChunk(0, {"role": "assistant", "content": None}),
        ChatChunk(0, {"reasoning_content": "The user wants "}),
        ChatChunk(0, {"reasoning_content": "the weather."}),
        ChatChunk(0, {"content": "Let me "}),
        ChatChunk(0, {"content": "check."}),
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
        ChatChunk(0, {}, finish_reason=finish_reason, timings={}),
        ChatChunk(-1, usage=USAGE),
    ]


def run_stream(chunks: list[ChatChunk], req: ResponsesRequest | None = None) -> list[tuple[str, dict[str, Any]]]:
    stream = ResponseStream(envelope("test-model", req or request(), resp_id="resp_test"), lambda text: len(text) // 4)
    events = stream.start()
    for chunk in chunks:
        events += stream.feed(chunk)
    return events + stream.finish(None)


def check_sequence(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    names = [name for name, _ in events]
    assert [d["type"] for _, d in events] == names
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    return names


# ------------------------------------------------- translation, no model
def test_items_become_chat_messages() -> None:
    req = request(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Tool."}],
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
            {"role": "user", "content": "Thanks"},
        ],
        tools=[
            {
                "type": "function",
                "name": "get_weather",
                "description": "Weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                "strict": True,
            }
        ],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=16,
        temperature=0.3,
        top_p=0.9,
        text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
        reasoning={"effort": "low"},
        store=False,
        include=["reasoning.encrypted_content"],
        min_p=0.05,
    )
    chat = to_chat_request(req)
    assert [m.role for m in chat.messages] == ["system", "system", "user", "assistant", "tool", "tool", "user"]
    assert chat.messages[0].content == "Be brief." and chat.messages[1].content == "Use tools."
    assistant = chat.messages[3]
    assert assistant.content == "Checking." and assistant.reasoning_content == "Tool."
    assert [c["id"] for c in assistant.tool_calls or []] == ["call_1", "call_2"]
    assert (assistant.tool_calls or [])[0]["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert chat.messages[4].tool_call_id == "call_1" and chat.messages[5].content == "noon"
    assert chat.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather",
                "strict": True,
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    assert chat.tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert chat.parallel_tool_calls is False and chat.max_tokens == 16
    assert chat.temperature == 0.3 and chat.top_p == 0.9 and chat.min_p == 0.05
    assert chat.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
    }
    assert chat.reasoning_effort == "low" and chat.chat_template_kwargs == {"enable_thinking": True}
    extra = chat.model_extra or {}
    assert "store" not in extra and "include" not in extra


def test_function_call_without_text_starts_an_assistant_turn() -> None:
    chat = to_chat_request(
        request(
            input=[
                {"role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "1"},
            ]
        )
    )
    assert [m.role for m in chat.messages] == ["user", "assistant", "tool"]
    assert chat.messages[1].content is None and chat.messages[1].tool_calls


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"conversation": "conv_1"}, "conversation"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]},
            "file_id references are not supported",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]},
            "'input_file' input is not supported",
        ),
        ({"tools": [{"type": "web_search"}]}, "only 'function' tools"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference is not supported"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"input": []}, "at least one"),
    ],
)
def test_unsupported_input_is_a_clear_error(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(APIError) as info:
        to_chat_request(request(**fields))
    assert needle in info.value.message and info.value.status == 400


def test_history_goes_first_without_its_instructions() -> None:
    # Stored items as they come back from the store: ids, parts, and a
    # reasoning item at the seam; the new function call joins the stored
    # assistant turn just as it would within one input.
    history = [
        {"id": "msg_1", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "u1"}]},
        {
            "id": "msg_2",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "a1", "annotations": [], "logprobs": []}],
        },
        {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
    ]
    chat = to_chat_request(
        request(
            instructions="New rules.",
            previous_response_id="resp_1",
            input=[
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "1"},
            ],
        ),
        history,
    )
    assert [(m.role, m.content) for m in chat.messages] == [
        ("system", "New rules."),
        ("user", "u1"),
        ("assistant", "a1"),
        ("tool", "1"),
    ]
    assert chat.messages[2].reasoning_content == "hmm" and chat.messages[2].tool_calls
    plain = to_chat_request(request(input="u2", previous_response_id="resp_1"), history[:2])
    assert [(m.role, m.content) for m in plain.messages] == [("user", "u1"), ("assistant", "a1"), ("user", "u2")]
    with pytest.raises(APIError) as info:
        to_chat_request(request(input=[{"type": "nope"}]), history)
    assert info.value.message.startswith("input.0:")


def test_envelope_reports_store_and_previous_response_id() -> None:
    body = envelope("m", request(previous_response_id="resp_1"))
    assert body["store"] is True and body["previous_response_id"] == "resp_1"
    assert envelope("m", request(store=False))["store"] is False


def test_json_object_format_and_text_format() -> None:
    assert to_chat_request(request(text={"format": {"type": "json_object"}})).response_format == {"type": "json_object"}
    assert to_chat_request(request(text={"format": {"type": "text"}})).response_format is None


# --------------------------------------------------- responses, no model
def test_output_items_and_finish() -> None:
    message = ParsedMessage(content="Checking.", reasoning="think", tool_calls=[ToolCall("f", "{}", "call_1")])
    items = output_items(message, "tool_calls")
    assert [i["type"] for i in items] == ["reasoning", "message", "function_call"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "think"}] and items[0]["summary"] == []
    assert items[1]["content"][0] == {"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}
    assert items[2]["call_id"] == "call_1" and items[2]["arguments"] == "{}" and items[2]["status"] == "completed"
    body = finish(envelope("m", request(), resp_id="resp_x"), items, "tool_calls", USAGE, 1)
    assert body["status"] == "completed" and body["incomplete_details"] is None
    assert body["output_text"] == "Checking."
    assert body["usage"] == {
        "input_tokens": 20,
        "input_tokens_details": {"cached_tokens": 5},
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 1},
        "total_tokens": 29,
    }
    parsed = mock_client(json.dumps(body).encode(), "application/json").responses.create(model="m", input="x")
    assert parsed.output_text == "Checking." and parsed.output[2].type == "function_call"
    truncated = finish(envelope("m", request()), output_items(ParsedMessage(content="Hel"), "length"), "length", USAGE)
    assert truncated["status"] == "incomplete" and truncated["incomplete_details"] == {"reason": "max_output_tokens"}
    assert truncated["output"][0]["status"] == "incomplete"


def test_stream_events_for_reasoning_text_and_tools() -> None:
    events = run_stream(agent_chunks())
    assert check_sequence(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    by_name: dict[str, list[dict[str, Any]]] = {}
    for name, data in events:
        by_name.setdefault(name, []).append(data)
    assert [d["output_index"] for d in by_name["response.output_item.added"]] == [0, 1, 2, 3]
    assert by_name["response.function_call_arguments.done"][0]["arguments"] == '{"city": "Paris"}'
    added_call = by_name["response.output_item.added"][2]["item"]
    assert added_call == {
        "id": added_call["id"],
        "type": "function_call",
        "status": "in_progress",
        "call_id": "call_a",
        "name": "get_weather",
        "arguments": "",
    }
    assert by_name["response.output_text.done"][0]["text"] == "Let me check."
    final = by_name["response.completed"][0]["response"]
    assert final["status"] == "completed" and final["output_text"] == "Let me check."
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call", "function_call"]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == len("The user wants the weather.") // 4


def test_sdk_parses_the_synthetic_stream() -> None:
    body = sse(run_stream(agent_chunks()))
    client = mock_client(body, "text/event-stream")
    kinds = [e.type for e in client.responses.create(model="m", input="x", stream=True)]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    with mock_client(body, "text/event-stream").responses.stream(model="m", input="x") as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert "".join(deltas) == final.output_text == "Let me check."
    calls = [i for i in final.output if i.type == "function_call"]
    assert [(c.call_id, c.name, c.arguments) for c in calls] == [
        ("call_a", "get_weather", '{"city": "Paris"}'),
        ("call_b", "get_time", "{}"),
    ]
    reasoning = final.output[0]
    assert (
        reasoning.type == "reasoning"
        and reasoning.content
        and reasoning.content[0].text == "The user wants the weather."
    )


def test_truncated_stream_ends_with_response_incomplete() -> None:
    chunks = [
        ChatChunk(0, {"role": "assistant", "content": None}),
        ChatChunk(0, {"content": "Hel"}),
        ChatChunk(0, {}, finish_reason="length"),
        ChatChunk(-1, usage=USAGE),
    ]
    events = run_stream(chunks)
    names = check_sequence(events)
    assert names[-1] == "response.incomplete"
    final = events[-1][1]["response"]
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2][1]["item"]["status"] == "incomplete"
    kinds = [
        e.type
        for e in mock_client(sse(events), "text/event-stream").responses.create(model="m", input="x", stream=True)
    ]
    assert kinds[-1] == "response.incomplete"


def test_empty_answer_still_has_a_message_item() -> None:
    events = run_stream([ChatChunk(0, {}, finish_reason="stop"), ChatChunk(-1, usage=USAGE)])
    names = check_sequence(events)
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_failure_mid_stream_is_error_then_response_failed() -> None:
    stream = ResponseStream(envelope("m", request()))
    events = stream.start() + stream.feed(ChatChunk(0, {"content": "a"}))
    events += stream.fail(APIError("boom", "server_error"))
    names = check_sequence(events)
    assert names[-2:] == ["error", "response.failed"]
    assert events[-2][1]["message"] == "boom" and events[-1][1]["response"]["status"] == "failed"
    assert stream.finish(USAGE) == []


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=120)


def test_input_image_becomes_an_image_url_part() -> None:
    content = [
        {"type": "input_text", "text": "see"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
    ]
    chat = to_chat_request(request(input=[{"role": "user", "content": content}]))
    assert chat.messages[-1].content == [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
