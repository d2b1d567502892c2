"""Request and answer shapes of llama-server's own tests, checked on one SmolLM2 server
started with -v: __verbose, continue_final_message, input_tokens, stream extras
(prompt_progress, timings), n with id_slot, prompt_string objects, ignore_eos biases."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import RunningServer, start_server, stop_server

CHAT = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


@pytest.fixture(scope="module")
def srv(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("shapes")
    server = start_server(["-m", model_path, "-np", "2", "-c", "2048", "-b", "64", "-t", "2", "-v"], tmp)
    yield server
    stop_server(server)


def _post(srv: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{srv.url}{path}", json=body, timeout=120)


def _stream(srv: RunningServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = _post(srv, "/v1/chat/completions", {**body, "stream": True})
    assert r.status_code == 200, r.text
    lines = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    return [json.loads(ln) for ln in lines]


def test_verbose_answers_and_the_request_switch(srv: RunningServer) -> None:
    on = _post(srv, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}).json()
    assert "Book" in on["__verbose"]["prompt"]  # -v: on by default
    off = _post(srv, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2, "verbose": False}).json()
    assert "__verbose" not in off


def test_continue_final_message_and_its_conflict(srv: RunningServer) -> None:
    convo = [*CHAT, {"role": "assistant", "content": "Whill"}]
    body = {"messages": convo, "max_tokens": 1, "add_generation_prompt": False, "continue_final_message": True}
    ok = _post(srv, "/v1/chat/completions", body).json()
    assert ok["__verbose"]["prompt"].endswith("assistant\nWhill")
    both = _post(srv, "/v1/chat/completions", {**body, "add_generation_prompt": True})
    assert both.status_code == 400 and "continue_final_message" in both.json()["error"]["message"]


def test_input_tokens_counts_the_rendered_prompt(srv: RunningServer) -> None:
    r = _post(srv, "/v1/chat/completions/input_tokens", {"messages": CHAT})
    assert r.status_code == 200
    n = r.json()["input_tokens"]
    done = _post(srv, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 1}).json()
    assert n == done["usage"]["prompt_tokens"]


def test_stream_progress_and_timings(srv: RunningServer) -> None:
    long = [{"role": "user", "content": "This is a test " * 20}]
    chunks = _stream(srv, {"messages": long, "max_tokens": 2, "return_progress": True, "cache_prompt": False})
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert len(progress) >= 3  # the start, then one per 64-token batch
    assert progress[0]["processed"] == progress[0]["cache"]
    assert progress[-1]["processed"] == progress[-1]["total"]
    chunks = _stream(
        srv,
        {"messages": CHAT, "max_tokens": 3, "timings_per_token": True, "stream_options": {"include_usage": True}},
    )
    assert "timings" in chunks[-1] and chunks[-1]["choices"] == []
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert content and all("timings" in c for c in content)


def test_n_choices_on_one_slot_twice(srv: RunningServer) -> None:
    for _ in range(2):
        r = _post(srv, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "n": 2, "id_slot": 0})
        assert r.status_code == 200, r.text
        assert [c["finish_reason"] for c in r.json()["choices"]] == ["length", "length"]


def test_prompt_objects_and_ignore_eos_biases(srv: RunningServer) -> None:
    text = "I believe the meaning of life is"
    one = _post(srv, "/completion", {"prompt": {"prompt_string": text}, "n_predict": 2, "temperature": 0})
    assert one.status_code == 200
    pair = _post(srv, "/completion", {"prompt": [text, {"prompt_string": text}], "n_predict": 2, "temperature": 0})
    assert [b["content"] for b in pair.json()] == [one.json()["content"]] * 2
    media = _post(srv, "/completion", {"prompt": {"prompt_string": text, "multimodal_data": ["AAAA"]}})
    assert media.status_code == 400
    eos = _post(srv, "/completion", {"prompt": text, "n_predict": 2, "ignore_eos": True}).json()
    biases = eos["generation_settings"]["logit_bias"]
    assert biases and all(b["bias"] is None for b in biases)  # -inf is JSON null
    plain = _post(srv, "/completion", {"prompt": text, "n_predict": 2}).json()
    assert plain["generation_settings"]["logit_bias"] == []


def test_response_fields_pick_nested_values(srv: RunningServer) -> None:
    body = {"prompt": "Hello", "n_predict": 2, "response_fields": ["content", "generation_settings/n_predict"]}
    r = _post(srv, "/completion", body).json()
    assert set(r) == {"content", "generation_settings/n_predict"} and r["generation_settings/n_predict"] == 2


def test_progress_reports_carry_the_prompt_timings_so_far(srv: RunningServer) -> None:
    body = {
        "prompt": "the quick brown fox jumps over the lazy dog " * 20,
        "n_predict": 2,
        "stream": True,
        "cache_prompt": False,
        "return_progress": True,
        "timings_per_token": True,
    }
    r = _post(srv, "/completion", body)
    chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: ")]
    reports = [c for c in chunks if "prompt_progress" in c]
    assert len(reports) >= 3
    first = reports[0]["timings"]
    assert first["prompt_n"] == 0 and first["prompt_ms"] == 0.0  # sent before any prompt token is decoded
    spent = [c["timings"]["prompt_ms"] for c in reports]
    assert spent == sorted(spent) and spent[-1] > 0
