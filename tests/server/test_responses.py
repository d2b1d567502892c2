"""OpenAI Responses against the real server: /v1/responses, /v1/responses/input_tokens and
stored responses, through the official SDK on SmolLM2 (plain text and JSON output, then store,
previous_response_id, retrieve, delete and input_items, across a server restart).

The request translation and the event stream are tested without a model in
tests/unit/test_responses_translation.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from llamaserve.families.responses.protocol import ResponsesRequest

from .conftest import start_server, stop_server

GREEDY = {"temperature": 0.0}
USAGE = {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29, "prompt_tokens_details": {"cached_tokens": 5}}


# ------------------------------------------------------------------ helpers
def request(**fields: Any) -> ResponsesRequest:
    fields.setdefault("input", "Hi")
    return ResponsesRequest.model_validate(fields)


# ------------------------------------------------------------ real server
@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=120)


def test_create_with_string_input(client: openai.OpenAI) -> None:
    r = client.responses.create(model="any", input="Hi", max_output_tokens=16, **GREEDY)
    assert r.id.startswith("resp_") and r.object == "response" and r.status in ("completed", "incomplete")
    message = r.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text"
    assert r.output_text == message.content[0].text and r.output_text.strip()
    assert r.usage is not None and 0 < r.usage.output_tokens <= 16
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.input_tokens_details.cached_tokens <= r.usage.input_tokens
    if r.status == "incomplete":
        assert r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens"


def test_max_output_tokens_gives_incomplete(client: openai.OpenAI) -> None:
    r = client.responses.create(model="m", input="Write a long story about a dragon.", max_output_tokens=4, **GREEDY)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.usage is not None and r.usage.output_tokens == 4


def test_items_input_with_history(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="m",
        max_output_tokens=8,
        instructions="Answer briefly.",
        **GREEDY,
        input=[
            {"role": "developer", "content": "Prefer short words."},
            {"role": "user", "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 22C"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "It is sunny."}]},
            {"role": "user", "content": "Thanks!"},
        ],
    )
    assert r.output_text and r.usage is not None and r.usage.input_tokens > 20


def test_instructions_reach_the_prompt(base_url: str) -> None:
    # SmolLM2's template writes a default system prompt when there is none; the
    # instructions replace it, so compare two instructions of different length.
    def count(instructions: str) -> int:
        r = httpx.post(
            f"{base_url}/v1/responses/input_tokens",
            timeout=60,
            json={"model": "m", "input": "Hi", "instructions": instructions},
        )
        assert r.status_code == 200 and r.json()["object"] == "response.input_tokens"
        return int(r.json()["input_tokens"])

    assert count("You are a pirate. " * 5) - count("You are a pirate. ") == 4 * 5


def test_stream_via_sdk_matches_create(client: openai.OpenAI) -> None:
    whole = client.responses.create(model="m", input="Name a color.", max_output_tokens=12, **GREEDY)
    events = list(
        client.responses.create(model="m", input="Name a color.", max_output_tokens=12, stream=True, **GREEDY)
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if whole.status == "completed" else "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == text and final.usage is not None
    assert final.usage.output_tokens == whole.usage.output_tokens  # type: ignore[union-attr]


def test_stream_helper_final_response(client: openai.OpenAI) -> None:
    with client.responses.stream(model="m", input="Hi", max_output_tokens=16, **GREEDY) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(deltas) and final.output_text


class Verdict(BaseModel):
    ok: bool


def test_json_schema_text_format(client: openai.OpenAI) -> None:
    r = client.responses.parse(
        model="m", input="Is the sky blue? Answer in JSON.", text_format=Verdict, max_output_tokens=16, **GREEDY
    )
    assert r.status == "completed", r.output_text
    assert isinstance(r.output_parsed, Verdict)
    raw = client.responses.create(
        model="m",
        input="Give me a JSON object.",
        max_output_tokens=16,
        **GREEDY,
        text={
            "format": {
                "type": "json_schema",
                "name": "v",
                "strict": True,
                "schema": {
                    "type": "object",
                    "properties": {"ok": {"type": "boolean"}},
                    "required": ["ok"],
                    "additionalProperties": False,
                },
            }
        },
    )
    assert isinstance(json.loads(raw.output_text)["ok"], bool)


def test_bad_bodies_are_400(base_url: str) -> None:
    for raw in (b"{bad", json.dumps({"model": "m"}).encode(), json.dumps({"input": 5}).encode()):
        r = httpx.post(
            f"{base_url}/v1/responses", content=raw, headers={"content-type": "application/json"}, timeout=60
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"


# ------------------------------------------------------- stored responses
SHORT = {"max_output_tokens": 8, **GREEDY}


def item_texts(items: list[Any]) -> list[tuple[str, str]]:
    """(role, text) of message items, as the SDK parsed them."""
    return [(i.role, "".join(part.text for part in i.content)) for i in items if i.type == "message"]


def count_input_tokens(base_url: str, key: str = "none", **body: Any) -> int:
    r = httpx.post(
        f"{base_url}/v1/responses/input_tokens",
        json={"model": "m", **body},
        timeout=60,
        headers={"authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    return int(r.json()["input_tokens"])


def test_stored_response_retrieve_and_input_items(client: openai.OpenAI) -> None:
    r = client.responses.create(model="m", input="Hi", instructions="Be brief.", **SHORT)
    assert r.store is True
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.status == r.status
    assert got.instructions == "Be brief." and got.usage == r.usage
    items = client.responses.input_items.list(r.id)
    assert item_texts(items.data) == [("user", "Hi")] and items.data[0].id.startswith("msg_")
    assert items.first_id == items.last_id == items.data[0].id and items.has_more is False


def test_previous_response_id_continues_and_pages(client: openai.OpenAI, base_url: str) -> None:
    first = client.responses.create(
        model="m",
        **SHORT,
        input=[
            {"role": "user", "content": "Say one."},
            {"role": "assistant", "content": "one"},
            {"role": "user", "content": "Say two."},
        ],
    )
    second = client.responses.create(model="m", previous_response_id=first.id, input="Say three.", **SHORT)
    assert second.previous_response_id == first.id
    expected = [
        ("user", "Say one."),
        ("assistant", "one"),
        ("user", "Say two."),
        ("assistant", first.output_text),
        ("user", "Say three."),
    ]
    # The SDK follows after= through pages of 2 (desc, the default order).
    every = list(client.responses.input_items.list(second.id, limit=2))
    assert item_texts(every) == expected[::-1] and len({i.id for i in every}) == 5
    page = client.responses.input_items.list(second.id, limit=2, order="asc")
    assert item_texts(page.data) == expected[:2] and page.has_more is True
    # input_tokens sees the same conversation as the generation did.
    assert count_input_tokens(base_url, previous_response_id=first.id, input="Say three.") == second.usage.input_tokens  # type: ignore[union-attr]
    bad = httpx.get(f"{base_url}/v1/responses/{second.id}/input_items", params={"limit": 0}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


def test_stream_is_stored_and_delete_removes_it(client: openai.OpenAI, base_url: str) -> None:
    # The stream helper wants response.completed: "Hi" ends within 16 tokens (as above).
    with client.responses.stream(model="m", input="Hi", max_output_tokens=16, **GREEDY) as s:
        final = s.get_final_response()
    assert final.store is True
    assert client.responses.retrieve(final.id).output_text == final.output_text
    gone = httpx.delete(f"{base_url}/v1/responses/{final.id}", timeout=30)
    assert gone.status_code == 200 and gone.json() == {"id": final.id, "object": "response.deleted", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(final.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(final.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(final.id)
    other = client.responses.create(model="m", input="Hi", **SHORT)
    assert client.responses.delete(other.id) is None  # the SDK discards the body
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(other.id)


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    r = client.responses.create(model="m", input="Hi", store=False, **SHORT)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", input="Hi", previous_response_id=r.id, **SHORT)
    events = list(client.responses.create(model="m", input="Hi", store=False, stream=True, **SHORT))
    final = events[-1].response  # type: ignore[union-attr]
    assert final.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(final.id)


def test_unknown_previous_response_id_is_404(client: openai.OpenAI, base_url: str) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="m", input="Hi", previous_response_id="resp_unknown", **SHORT)
    assert "resp_unknown" in str(info.value)
    raw = httpx.post(
        f"{base_url}/v1/responses",
        timeout=30,
        json={"model": "m", "input": "Hi", "previous_response_id": "resp_unknown"},
    )
    assert raw.status_code == 404
    error = raw.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "previous_response_id"
    assert error["code"] == 404 and "resp_unknown" in error["message"]


def test_conversation_survives_a_restart(model_path: str, tmp_path: Path) -> None:
    key = "sk-responses"
    db = tmp_path / "not" / "yet" / "responses.sqlite3"
    args = ["-m", model_path, "-np", "1", "-c", "2048", "-t", "2", "--api-key", key, "--responses-db", str(db)]
    first_q, second_q = "My secret word is pineapple. Remember it.", "What is my secret word?"

    def sdk(url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)

    before = start_server(args, tmp_path)
    try:
        first = sdk(before.url).responses.create(
            model="m", input=first_q, instructions="Answer in French.", store=True, **SHORT
        )
        assert first.store is True
    finally:
        stop_server(before)  # SIGTERM
    assert before.process.poll() is not None and db.exists()

    after = start_server(args, tmp_path)
    try:
        client = sdk(after.url)
        # The stored routes are guarded by the API key like every other route.
        assert httpx.get(f"{after.url}/v1/responses/{first.id}", timeout=30).status_code == 401
        assert httpx.delete(f"{after.url}/v1/responses/{first.id}", timeout=30).status_code == 401
        again = client.responses.retrieve(first.id)
        assert again.id == first.id and again.output_text == first.output_text
        assert again.instructions == "Answer in French."
        follow = client.responses.create(model="m", previous_response_id=first.id, input=second_q, **SHORT)
        assert follow.previous_response_id == first.id and follow.usage is not None
        # The prompt is exactly the earlier turn plus the new input, and the
        # earlier instructions are not carried over (OpenAI's semantics).
        explicit = count_input_tokens(
            after.url,
            key,
            input=[
                {"role": "user", "content": first_q},
                {"role": "assistant", "content": first.output_text},
                {"role": "user", "content": second_q},
            ],
        )
        alone = count_input_tokens(after.url, key, input=second_q)
        assert follow.usage.input_tokens == explicit > alone
        items = client.responses.input_items.list(follow.id, order="asc")
        assert item_texts(items.data) == [("user", first_q), ("assistant", first.output_text), ("user", second_q)]
        assert client.responses.retrieve(follow.id).output_text == follow.output_text
    finally:
        stop_server(after)
