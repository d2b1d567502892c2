"""Named API keys with limits (--api-keys-config) and their usage, on a real SmolLM2 server.

One server holds five keys: alice (2 requests a minute), bob (30 tokens a minute), carol (2
requests in flight), dave (max_tokens 8) and erin (an admin, no limits). Each limit answers
its 429 with Retry-After in the OpenAI and the Anthropic envelopes while erin goes on; usage
is counted per key name and model, shown in /metrics by name only and in GET /usage, and is
still there after a restart.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.server.conftest import RunningServer, start_server, stop_server

KEYS = {name: f"sk-{name}-5ecret-{i}" for i, name in enumerate(("alice", "bob", "carol", "dave", "erin", "fay"))}
CONFIG = f"""
[[keys]]
name = "alice"
key = "{KEYS["alice"]}"
requests_per_minute = 2

[[keys]]
name = "bob"
key = "{KEYS["bob"]}"
tokens_per_minute = 30

[[keys]]
name = "carol"
key = "{KEYS["carol"]}"
max_concurrent = 2

[[keys]]
name = "dave"
key = "{KEYS["dave"]}"
max_tokens = 8

[[keys]]
name = "erin"
key = "{KEYS["erin"]}"
admin = true

[[keys]]
name = "fay"
key = "{KEYS["fay"]}"
tokens_per_minute = 100
"""
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
MESSAGE = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def _args(tmp: Path, model_path: str) -> list[str]:
    config = tmp / "keys.toml"
    config.write_text(CONFIG)
    return ["-m", model_path, "-np", "4", "-c", "4096", "-t", "2", "--temp", "0", "--metrics"] + [
        "--api-keys-config",
        str(config),
        "--usage-db",
        str(tmp / "usage.sqlite3"),
        "--batch-dir",
        str(tmp / "batches"),
    ]


@pytest.fixture(scope="module")
def keyed(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("quota")
    srv = start_server(_args(tmp, model_path), tmp)
    yield srv, tmp
    stop_server(srv)


def _auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def _chat(url: str, name: str, **extra: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json={**CHAT, **extra}, headers=_auth(name), timeout=120)


def _message(url: str, name: str) -> httpx.Response:
    headers = {"x-api-key": KEYS[name], "anthropic-version": "2023-06-01"}
    return httpx.post(f"{url}/v1/messages", json=MESSAGE, headers=headers, timeout=120)


def _assert_429(openai_answer: httpx.Response, anthropic_answer: httpx.Response, limit: str) -> None:
    for answer in (openai_answer, anthropic_answer):
        assert answer.status_code == 429, answer.text
        assert 1 <= int(answer.headers["retry-after"]) <= 60
    error = openai_answer.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == 429
    assert limit in error["message"]
    body = anthropic_answer.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert limit in body["error"]["message"]


def _usage(url: str, name: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/usage", headers=_auth(name), timeout=30)
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()["data"]
    return rows


def _row(url: str, name: str) -> dict[str, Any]:
    return next(r for r in _usage(url, "erin") if r["key"] == name)


def test_requests_per_minute_refuses_with_retry_after_while_another_key_goes_on(
    keyed: tuple[RunningServer, Path],
) -> None:
    url = keyed[0].url
    assert _chat(url, "alice").status_code == 200
    assert _message(url, "alice").status_code == 200
    _assert_429(_chat(url, "alice"), _message(url, "alice"), "requests_per_minute")
    # erin is not held back by alice's window: every request of hers goes through at once.
    for _ in range(3):
        assert _chat(url, "erin").status_code == 200
    # The official SDKs read the refusal as their rate-limit error.
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS["alice"], max_retries=0)
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    claude = anthropic.Anthropic(base_url=url, api_key=KEYS["alice"], max_retries=0)
    with pytest.raises(anthropic.RateLimitError):
        claude.messages.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)


def test_tokens_per_minute_counts_prompt_and_completion_then_refuses(keyed: tuple[RunningServer, Path]) -> None:
    url = keyed[0].url
    first = _chat(url, "bob")
    assert first.status_code == 200
    used = first.json()["usage"]
    assert used["prompt_tokens"] + used["completion_tokens"] >= 30  # the chat template alone passes 30
    _assert_429(_chat(url, "bob"), _message(url, "bob"), "tokens_per_minute")
    assert _chat(url, "erin").status_code == 200


def _stream(url: str, name: str, first_seen: threading.Event, out: list[Any]) -> None:
    body = {**CHAT, "max_tokens": 120, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=_auth(name), timeout=120) as answer:
        chunks = []
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
                first_seen.set()
        out.append((answer.status_code, chunks))
    first_seen.set()


def test_streams_over_the_concurrency_limit_are_refused_the_others_complete(
    keyed: tuple[RunningServer, Path],
) -> None:
    url = keyed[0].url
    results: list[Any] = []
    started = [threading.Event(), threading.Event()]
    threads = [threading.Thread(target=_stream, args=(url, "carol", ev, results)) for ev in started]
    for thread in threads:
        thread.start()
    for ev in started:
        assert ev.wait(120)
    # Both streams are in flight (each has sent a chunk and asked for 120 tokens).
    assert len(results) == 0
    _assert_429(_chat(url, "carol", stream=True), _message(url, "carol"), "max_concurrent")
    for thread in threads:
        thread.join(120)
    assert len(results) == 2
    for status, chunks in results:
        assert status == 200
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    # Their places are free again.
    assert _chat(url, "carol").status_code == 200


def test_max_tokens_over_the_cap_is_a_400_and_a_request_naming_none_gets_the_cap(
    keyed: tuple[RunningServer, Path],
) -> None:
    url = keyed[0].url
    over = _chat(url, "dave", max_tokens=9)
    assert over.status_code == 400
    assert "max_tokens limit of 8" in over.json()["error"]["message"]
    native = httpx.post(f"{url}/completion", json={"prompt": "Hi", "n_predict": -1}, headers=_auth("dave"))
    assert native.status_code == 400 and "unlimited" in native.json()["error"]["message"]
    body = {"messages": [{"role": "user", "content": "Write a long story."}], "ignore_eos": True}
    capped = httpx.post(f"{url}/v1/chat/completions", json=body, headers=_auth("dave"), timeout=120)
    assert capped.status_code == 200
    assert capped.json()["usage"]["completion_tokens"] == 8


def abandon_stream(url: str, headers: dict[str, str], events: int) -> None:
    """A stream asked for 400 tokens, left after `events` chunks with text."""
    body = {**CHAT, "max_tokens": 400, "stream": True, "ignore_eos": True}
    seen = 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                seen += 1
                if seen == events:
                    break


def wait_for(check: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not seen in time"
        time.sleep(0.1)


def test_a_stream_its_client_leaves_is_charged_the_tokens_it_streamed(keyed: tuple[RunningServer, Path]) -> None:
    url = keyed[0].url
    abandon_stream(url, _auth("fay"), 120)
    # The server sees the client gone, then charges what was streamed: over fay's 100 a minute.
    wait_for(lambda: any(r["key"] == "fay" and r["completion_tokens"] >= 120 for r in _usage(url, "erin")))
    _assert_429(_chat(url, "fay"), _message(url, "fay"), "tokens_per_minute")


def test_a_batchs_lines_run_under_the_key_that_created_it(keyed: tuple[RunningServer, Path]) -> None:
    """The Batch API runs each line through the app with its creator's key: the key's cap
    answers the line that asks too much, and every line is counted as the key's usage."""
    url = keyed[0].url
    before = sum(r["requests"] for r in _usage(url, "dave"))
    lines = [
        {"custom_id": name, "method": "POST", "url": "/v1/chat/completions", "body": {**CHAT, "max_tokens": n}}
        for name, n in (("small", 4), ("big", 50), ("fine", 8))
    ]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEYS["dave"], max_retries=0, timeout=60)
    data = ("\n".join(json.dumps(line) for line in lines) + "\n").encode()
    upload = client.files.create(file=("lines.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(lambda: client.batches.retrieve(batch.id).status == "completed", 120)
    done = client.batches.retrieve(batch.id)
    records = []
    for file_id in (done.output_file_id, done.error_file_id):
        if file_id:
            records += [json.loads(row) for row in client.files.content(file_id).text.splitlines()]
    by_id = {r["custom_id"]: r for r in records}
    assert by_id["small"]["response"]["status_code"] == 200
    assert by_id["fine"]["response"]["status_code"] == 200
    big = by_id["big"]
    assert big["response"]["status_code"] == 400
    assert "max_tokens limit of 8" in json.dumps(big)
    assert sum(r["requests"] for r in _usage(url, "dave")) - before >= 5  # the upload, the batch, its 3 lines


def test_usage_per_key_and_model_matches_the_answers(keyed: tuple[RunningServer, Path]) -> None:
    url = keyed[0].url
    before = _row(url, "erin")
    answers = [_chat(url, "erin", max_tokens=3).json()["usage"] for _ in range(2)]
    after = _row(url, "erin")
    served = httpx.get(f"{url}/v1/models", headers=_auth("erin")).json()["data"][0]["id"]
    assert after["model"] == before["model"] == served
    assert after["requests"] - before["requests"] == 2
    assert after["prompt_tokens"] - before["prompt_tokens"] == sum(a["prompt_tokens"] for a in answers)
    assert after["completion_tokens"] - before["completion_tokens"] == sum(a["completion_tokens"] for a in answers)
    cached = sum(a.get("prompt_tokens_details", {}).get("cached_tokens", 0) for a in answers)
    assert after["cached_tokens"] - before["cached_tokens"] == cached > 0
    # A refusal is a request with an error.
    assert _row(url, "alice")["errors"] >= 3
    # A key that is no admin sees its own row only.
    assert {r["key"] for r in _usage(url, "bob")} == {"bob"}
    assert {r["key"] for r in _usage(url, "erin")} >= {"alice", "bob", "erin"}


def test_metrics_label_usage_with_the_key_name_never_the_key(keyed: tuple[RunningServer, Path]) -> None:
    url = keyed[0].url
    text = httpx.get(f"{url}/metrics", headers=_auth("erin"), timeout=30).text
    assert "llamacpp:prompt_tokens_total" in text  # the server's own metrics are still there
    lines = [line for line in text.splitlines() if line.startswith("llamaserve:key_requests_total{")]
    assert any('key="alice"' in line for line in lines)
    assert any('key="erin"' in line and "model=" in line for line in lines)
    for secret in KEYS.values():
        assert secret not in text


def test_usage_survives_a_restart(keyed: tuple[RunningServer, Path], model_path: str) -> None:
    srv, tmp = keyed
    before = _usage(srv.url, "erin")
    stop_server(srv)
    again = start_server(_args(tmp, model_path), tmp)
    try:
        assert _usage(again.url, "erin") == before
        # The limits' windows start afresh; the counts go on from where they were.
        assert _chat(again.url, "alice").status_code == 200
        assert _row(again.url, "alice")["requests"] == next(r for r in before if r["key"] == "alice")["requests"] + 1
    finally:
        stop_server(again)
