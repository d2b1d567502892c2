"""/metrics in llama-server's text, idle /slots, token counting, Vertex AI's /predict and
resumable streams (X-Conversation-Id), on one real SmolLM2 server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import RunningServer, free_port, start_server, stop_server

CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    port = free_port()
    env = {"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port), "AIP_HEALTH_ROUTE": "vertex-health"}
    server = start_server(
        ["--metrics", "--slots", "-np", "1", "-c", "1024"], tmp_path_factory.mktemp("m"), env=env, port=port
    )
    yield server
    stop_server(server)


def metrics(server: RunningServer) -> tuple[httpx.Response, dict[str, float]]:
    r = httpx.get(f"{server.url}/metrics", timeout=30)
    assert r.status_code == 200
    types = {line.split()[2] for line in r.text.splitlines() if line.startswith("# TYPE ")}
    values = {}
    for line in r.text.splitlines():
        if line.startswith("llamacpp:") and "{" not in line:  # histograms have labels
            name, value = line.split(" ")
            assert name in types, f"{name} has no TYPE line of its own name"
            values[name] = float(value)
    return r, values


def test_metrics_count_steps_not_the_free_first_token(srv: RunningServer) -> None:
    r, before = metrics(srv)
    assert float(r.headers["Process-Start-Time-Unix"]) > 0
    body = {"prompt": "I believe", "n_predict": 8, "ignore_eos": True, "temperature": 0}
    timings = httpx.post(f"{srv.url}/completion", json=body, timeout=120).json()["timings"]
    assert timings["predicted_n"] == 8
    assert timings["predicted_per_second"] == pytest.approx(1e3 / timings["predicted_ms"] * 7)
    assert timings["predicted_per_token_ms"] == pytest.approx(timings["predicted_ms"] / 7)
    _, after = metrics(srv)
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == 8
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == timings["prompt_n"]
    assert after["llamacpp:spec_decode_num_drafts_total"] == 0
    # the window closed at the previous scrape: nothing ran since
    assert metrics(srv)[1]["llamacpp:predicted_tokens_seconds"] == 0


def test_idle_slot_has_no_budget_left_over(srv: RunningServer) -> None:
    httpx.post(f"{srv.url}/completion", json={"prompt": "Hi", "n_predict": 4}, timeout=120)
    (slot,) = httpx.get(f"{srv.url}/slots", timeout=30).json()
    assert slot["is_processing"] is False
    assert slot["next_token"][0]["n_remain"] == -1
    assert slot["next_token"][0]["n_decoded"] == 0


def test_chat_input_tokens(srv: RunningServer) -> None:
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        r = httpx.post(f"{srv.url}{path}", json={"messages": CHAT["messages"]}, timeout=30)
        assert r.status_code == 200
        assert r.json()["input_tokens"] > 3
    r = httpx.post(f"{srv.url}/responses/input_tokens", json={"input": "Hello"}, timeout=30)
    assert r.json()["input_tokens"] > 0


def test_vertex_predict_runs_each_instance(srv: RunningServer) -> None:
    instances = [
        {"@requestFormat": "chatCompletions", **CHAT, "stream": True},  # streaming is turned off
        {"@requestFormat": "/tokenize", "content": "hello world"},
        {"@requestFormat": "noSuchRoute"},
        "not an object",
        # The routes that act on the machine are not predict targets (docs/security.md).
        {"@requestFormat": "/tools"},
    ]
    r = httpx.post(f"{srv.url}/predict", json={"instances": instances}, timeout=120)
    assert r.status_code == 200
    chat, tokens, unknown, bad, tools = r.json()["predictions"]
    assert "no handler registered for @requestFormat: /tools" in tools["error"]["message"]
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["choices"][0]["message"]["content"]
    assert len(tokens["tokens"]) >= 2
    assert "noSuchRoute" in unknown["error"]["message"]
    assert bad["error"]["code"] == 400
    assert httpx.post(f"{srv.url}/predict", json={"instances": {}}, timeout=30).status_code == 400
    assert httpx.get(f"{srv.url}/vertex-health", timeout=30).json() == {"status": "ok"}


def _chat_stream(srv: RunningServer, conv: str) -> httpx.Response:
    body = {**CHAT, "stream": True, "max_tokens": 8}
    return httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv}, timeout=120)


def test_stream_replays_then_stop_evicts(srv: RunningServer) -> None:
    conv = "conv-1::org/model:Q8_0"
    live = _chat_stream(srv, conv).text
    assert "data: [DONE]" in live
    q = {"conv_id": conv}
    replay = httpx.get(f"{srv.url}/v1/stream", params={**q, "from": "0"}, timeout=30)
    assert replay.status_code == 200 and replay.text == live
    tail = httpx.get(f"{srv.url}/v1/stream", params={**q, "from": str(len(live.encode()) - 14)}, timeout=30)
    assert tail.text == "data: [DONE]\n\n"
    (found,) = httpx.post(f"{srv.url}/v1/streams/lookup", json={"conversation_ids": ["conv-1"]}, timeout=30).json()
    assert found["conversation_id"] == conv and found["is_done"] and found["total_bytes"] == len(live.encode())
    assert httpx.post(f"{srv.url}/v1/streams/lookup", json={"conversation_ids": ["other"]}, timeout=30).json() == []
    assert httpx.get(f"{srv.url}/v1/stream", params={**q, "from": "x"}, timeout=30).status_code == 400
    assert httpx.delete(f"{srv.url}/v1/stream", params=q, timeout=30).status_code == 204
    assert httpx.get(f"{srv.url}/v1/stream", params=q, timeout=30).status_code == 404
    assert httpx.delete(f"{srv.url}/v1/stream", params=q, timeout=30).status_code == 204  # idempotent
    assert httpx.get(f"{srv.url}/v1/stream", timeout=30).status_code == 400


def test_stream_survives_the_client_leaving(srv: RunningServer) -> None:
    conv = "conv-2"
    body = {**CHAT, "stream": True, "max_tokens": 8, "ignore_eos": True}
    with httpx.stream(
        "POST", f"{srv.url}/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv}, timeout=120
    ) as r:
        next(r.iter_bytes())  # the first chunk, then the client goes away
    deadline = time.time() + 120
    while True:
        replay = httpx.get(f"{srv.url}/v1/stream", params={"conv_id": conv, "from": "0"}, timeout=120).text
        if "[DONE]" in replay or time.time() > deadline:
            break
        time.sleep(0.2)
    assert replay.count('"finish_reason":"length"') == 1
    assert "data: [DONE]" in replay


def test_embedding_prompt_is_counted(tmp_path: Path) -> None:
    server = start_server(["--metrics", "--embedding", "--pooling", "last", "-np", "1"], tmp_path)
    try:
        r = httpx.post(f"{server.url}/v1/embeddings", json={"input": ["hello world", "goodbye"]}, timeout=60)
        assert r.status_code == 200
        _, values = metrics(server)
        assert values["llamacpp:prompt_tokens_total"] == r.json()["usage"]["prompt_tokens"]
        assert values["llamacpp:n_decode_total"] >= 1
        assert values["llamacpp:tokens_predicted_total"] == 0
    finally:
        stop_server(server)
