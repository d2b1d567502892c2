"""Reasoning control and the chat request fields llama-server adds for it, on SmolLM2.

`POST /v1/chat/completions/control` with `reasoning_end` closes a running answer's reasoning
block (armed by `reasoning_control: true`); `generation_prompt` says where the answer starts;
`parse_tool_calls: false` leaves tool calls in the text; `sse_ping_interval` sets a stream's
pings per request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import RunningServer, start_server, stop_server

# SmolLM2's ChatML, with a generation prompt that opens a reasoning block, as Qwen 3's does.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]


@pytest.fixture(scope="module")
def thinking(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("reasoning_control")
    template = tmp / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    args = ["-m", model_path, "-c", "2048", "-np", "2", "-t", "2", "--chat-template-file", str(template)]
    srv = start_server([*args, "--reasoning-format", "deepseek"], tmp)
    yield srv
    stop_server(srv)


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def _control(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions/control", json=body, timeout=30)


def test_reasoning_end_closes_the_block_of_a_running_answer(thinking: RunningServer) -> None:
    body = {
        "messages": STORY,
        "stream": True,
        "temperature": 0,
        "max_tokens": 1500,
        "ignore_eos": True,
        "reasoning_control": True,
    }
    reasoning, content, ended_at = "", "", -1
    with httpx.stream("POST", f"{thinking.url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        n_reasoning = 0
        for event in _events(r.iter_lines()):
            delta = event["choices"][0]["delta"] if event["choices"] else {}
            reasoning += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            n_reasoning += bool(delta.get("reasoning_content"))
            if n_reasoning == 5 and ended_at < 0:
                # The id the stream carries names the running answer.
                answer = _control(thinking.url, {"id": event["id"], "action": "reasoning_end"})
                assert answer.status_code == 200 and answer.json() == {"success": True}
                ended_at = len(reasoning)
            if content.strip():
                break  # the answer follows the closed block; leaving aborts the rest
    assert ended_at > 0 and content.strip(), (reasoning, content)
    # The model had 1500 tokens to go on thinking: the block ended where it was asked to, give
    # or take the tokens already decoded while the request travelled.
    assert len(reasoning) < ended_at + 200, (ended_at, reasoning)


def test_control_answers_as_llama_server_does(thinking: RunningServer) -> None:
    # Nothing running under that id: a 200 saying so.
    r = _control(thinking.url, {"id": "chatcmpl-nothing", "action": "reasoning_end"})
    assert r.status_code == 200 and r.json() == {"success": False, "message": "no active completion for this id"}
    # A missing id and an unknown action are 400s with llama-server's messages.
    r = _control(thinking.url, {"action": "reasoning_end"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "missing completion id"
    r = _control(thinking.url, {"id": "chatcmpl-x", "action": "stop"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "unknown control action"
    # A running answer that was not armed with reasoning_control.
    body = {"messages": STORY, "stream": True, "max_tokens": 1500, "ignore_eos": True}
    with httpx.stream("POST", f"{thinking.url}/v1/chat/completions", json=body, timeout=120) as r:
        events = _events(r.iter_lines())  # held: a dropped iterator closes the stream, which aborts the answer
        first = next(events)
        answer = _control(thinking.url, {"id": first["id"], "action": "reasoning_end", "model": "any"})
    assert answer.json() == {"success": False, "message": "reasoning control not enabled for this completion"}


def test_the_stream_and_whole_answer_ids_are_the_ones_control_takes(thinking: RunningServer) -> None:
    """Every chunk of one stream carries one id, and the whole answer has its own `chatcmpl-` id."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{thinking.url}/v1/chat/completions", json=body, timeout=60) as r:
        ids = {e["id"] for e in _events(r.iter_lines())}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    whole = httpx.post(f"{thinking.url}/v1/chat/completions", json={**body, "stream": False}, timeout=60).json()
    assert whole["id"].startswith("chatcmpl-")


def test_generation_prompt_says_the_answer_starts_inside_the_reasoning(base_url: str) -> None:
    """SmolLM2's own template opens no block: its answer is content. Told that the generation
    prompt opened one, the same text is reasoning (an unclosed block runs to the end)."""
    body = {
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 8,
        "temperature": 0,
        "reasoning_format": "deepseek",
    }
    plain = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
    opened = httpx.post(
        f"{base_url}/v1/chat/completions",
        json={**body, "generation_prompt": "<|im_start|>assistant\n<think>\n"},
        timeout=60,
    ).json()["choices"][0]["message"]
    assert plain["content"].strip() and not plain.get("reasoning_content")
    assert opened["reasoning_content"].strip() == plain["content"].strip()
    assert not (opened["content"] or "").strip()


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_parse_tool_calls_false_leaves_the_call_in_the_text(base_url: str) -> None:
    body = {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 60,
        "temperature": 0,
    }
    parsed = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120).json()["choices"][0]
    raw = httpx.post(f"{base_url}/v1/chat/completions", json={**body, "parse_tool_calls": False}, timeout=120).json()[
        "choices"
    ][0]
    assert parsed["finish_reason"] == "tool_calls" and parsed["message"]["tool_calls"]
    call = parsed["message"]["tool_calls"][0]["function"]
    assert raw["finish_reason"] == "stop" and not raw["message"].get("tool_calls")
    # The same grammar shaped the text: the call is there, unparsed.
    assert "get_weather" in raw["message"]["content"] and call["name"] == "get_weather"


def _pings_while_queued(url: str, extra: dict[str, Any], wait_s: float) -> bytes:
    """The bytes a stream receives in `wait_s` seconds while it waits for slot 0, busy with another."""
    started, stop = threading.Event(), threading.Event()

    def hold_slot_0() -> None:
        hold = {"prompt": "Count:", "n_predict": 3000, "ignore_eos": True, "stream": True, "id_slot": 0}
        with httpx.stream("POST", f"{url}/completion", json=hold, timeout=120) as r:
            for _ in r.iter_bytes():
                started.set()
                if stop.is_set():
                    return

    holder = threading.Thread(target=hold_slot_0)
    holder.start()
    received = b""
    try:
        assert started.wait(60)
        body = {"prompt": "Hi", "n_predict": 2, "stream": True, "id_slot": 0, **extra}
        with httpx.stream("POST", f"{url}/completion", json=body, timeout=60) as r:
            chunks = r.iter_raw()
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and b":\n\n:\n\n" not in received:
                received += next(chunks)
            stop.set()
    finally:
        stop.set()
        holder.join(60)
    return received


def test_a_request_sets_its_own_ping_interval(base_url: str) -> None:
    """The server pings every 30 s; a request asking for 1 s gets a ping each quiet second
    while it waits for its slot."""
    start = time.monotonic()
    received = _pings_while_queued(base_url, {"sse_ping_interval": 1}, 20)
    assert received.startswith(b":\n\n:\n\n"), received
    assert time.monotonic() - start >= 2


def test_a_bad_ping_interval_is_a_400(base_url: str) -> None:
    r = httpx.post(f"{base_url}/completion", json={"prompt": "Hi", "n_predict": 1, "sse_ping_interval": -2})
    assert r.status_code == 400 and "sse_ping_interval" in r.text
