"""The request contract: every parameter honoured or refused by name, every bad input a 4xx.

Each test is one defect class found when the server was tried as a new user
would: deep nesting, n_discard, post-sampling probabilities, open-ended JSON
objects, the reasoning budget, and a fuzz run over every POST route.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz_bodies import bodies
from tests.models.bert import cached_models

from .conftest import RunningServer, start_server, stop_server

DEEP = 10_000
MINILM_DIMENSIONS = 384  # all-MiniLM-L6-v2's n_embd


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0)


def deep_list(depth: int) -> str:
    return "[" * depth + "]" * depth


POST_ROUTES = [
    "/v1/chat/completions",
    "/v1/chat/completions/control",
    "/v1/completions",
    "/completion",
    "/infill",
    "/v1/embeddings",
    "/embedding",
    "/rerank",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/batches",
    "/slots/0?action=save",
    "/lora-adapters",
]


@pytest.mark.parametrize("route", POST_ROUTES)
def test_deep_nesting_is_a_400_naming_the_limit(base_url: str, route: str) -> None:
    for body in (
        '{"messages": ' + deep_list(DEEP) + "}",  # in a known field
        '{"prompt": "hi", "unknown": ' + deep_list(DEEP) + "}",  # in a field we do not know
    ):
        r = httpx.post(f"{base_url}{route}", content=body, headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == 400, (route, r.status_code, r.text[:300])
        error = r.json()["error"]
        assert "deeper than 128 levels" in error["message"], error
        if route.startswith("/v1/messages"):
            assert r.json()["type"] == "error"  # Anthropic's envelope


def test_deep_tool_call_arguments_do_not_crash_the_template(client: openai.OpenAI) -> None:
    arguments = '{"a": ' + deep_list(5000) + "}"
    messages: Any = [
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    try:
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=2)
        assert r.choices[0].message is not None
    except openai.BadRequestError as exc:  # a clear 400 is as good as an answer
        assert exc.status_code == 400


@pytest.mark.parametrize(("field", "value"), [("n_discard", -5), ("n_keep", -2)])
def test_negative_n_discard_and_n_keep_are_refused(base_url: str, field: str, value: int) -> None:
    r = httpx.post(f"{base_url}/completion", json={"prompt": "Hi", "n_predict": 2, field: value}, timeout=30)
    assert r.status_code == 400
    assert field in r.json()["error"]["message"]


def test_n_discard_is_used_for_the_context_shift(model_path: str, tmp_path: Path) -> None:
    srv = start_server(["-m", model_path, "-c", "128", "-np", "1", "-t", "2", "--context-shift"], tmp_path)
    try:
        # llama.cpp rounds the context up to 256 tokens: 400 tokens need shifts.
        body = {"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True, "n_keep": 4, "n_discard": 10}
        r = httpx.post(f"{srv.url}/completion", json={**body, "temperature": 0}, timeout=120)
        assert r.status_code == 200
        out = r.json()
        assert out["truncated"] is True and out["tokens_predicted"] == 400
        assert out["generation_settings"]["n_discard"] == 10
    finally:
        stop_server(srv)


def test_post_sampling_probs_report_the_chains_probabilities(base_url: str) -> None:
    body = {"prompt": "The colour of the sky is", "n_predict": 6, "n_probs": 5, "seed": 3, "temperature": 1.0}
    raw = httpx.post(f"{base_url}/completion", json={**body, "top_k": 2}, timeout=60).json()
    post = httpx.post(
        f"{base_url}/completion", json={**body, "top_k": 2, "post_sampling_probs": True}, timeout=60
    ).json()
    assert raw["content"] == post["content"]  # the same draws, only the report differs
    for entry in raw["completion_probabilities"]:
        assert "logprob" in entry and len(entry["top_logprobs"]) == 5  # the raw distribution
    for entry in post["completion_probabilities"]:
        assert "prob" in entry and "logprob" not in entry
        tops = entry["top_probs"]
        assert 1 <= len(tops) <= 2  # top_k 2 left at most two candidates
        assert math.isclose(sum(t["prob"] for t in tops), 1.0, abs_tol=1e-4)
        assert entry["id"] in [t["id"] for t in tops]
        assert all(0.0 < t["prob"] <= 1.0 for t in tops)
    # Greedy after the chain: the chosen token has probability 1.
    greedy = httpx.post(
        f"{base_url}/completion",
        json={**body, "temperature": 0, "post_sampling_probs": True},
        timeout=60,
    ).json()
    assert all(math.isclose(e["prob"], 1.0) for e in greedy["completion_probabilities"])


def test_a_person_schema_without_additional_properties_gives_just_its_keys(client: openai.OpenAI) -> None:
    """The schema instructor and most users send: valid within 64 tokens, no invented keys."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Extract: Abe is 30 years old."}],
        max_tokens=64,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "Person", "schema": schema}},
    )
    assert r.choices[0].finish_reason == "stop"
    person = json.loads(r.choices[0].message.content or "")
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


@pytest.fixture(scope="module")
def thinking_server(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """SmolLM2 under a template that opens a reasoning block, with an 8-token budget."""
    tmp = tmp_path_factory.mktemp("thinking")
    template = tmp / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    srv = start_server(
        [
            "-m",
            model_path,
            "-c",
            "2048",
            "-np",
            "2",
            "-t",
            "2",
            "--chat-template-file",
            str(template),
            "--reasoning-format",
            "deepseek",
            "--reasoning-budget",
            "8",
            "--reasoning-budget-message",
            "Budget spent.",
        ],
        tmp,
    )
    yield srv
    stop_server(srv)


def test_the_reasoning_budget_ends_the_block_and_the_answer_follows(thinking_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=f"{thinking_server.url}/v1", api_key="none", max_retries=0)
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        max_tokens=60,
        temperature=0,
    )
    message: Any = r.choices[0].message
    reasoning = message.model_extra.get("reasoning_content") or ""
    assert reasoning.rstrip().endswith("Budget spent."), reasoning
    assert len(reasoning.split()) <= 8 + 2 + 4  # the budget, the message, a few short tokens
    assert (message.content or "").strip(), "the answer must follow the closed block"
    # Per request: 0 closes the block at once.
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=20,
        temperature=0,
        extra_body={"reasoning_budget_tokens": 0},
    )
    assert (r.choices[0].message.model_extra or {}).get("reasoning_content", "").strip() == "Budget spent."


def test_anthropic_thinking_budget_tokens_is_enforced(thinking_server: RunningServer) -> None:
    client = anthropic.Anthropic(base_url=thinking_server.url, api_key="none", max_retries=0)
    msg = client.messages.create(
        model="m",
        max_tokens=60,
        thinking={"type": "enabled", "budget_tokens": 4},
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Write a long story about a dragon."}],
    )
    kinds = [b.type for b in msg.content]
    assert kinds[0] == "thinking" and "text" in kinds, kinds
    thinking = msg.content[0].thinking  # type: ignore[union-attr]
    assert thinking.rstrip().endswith("Budget spent.") and len(thinking.split()) <= 4 + 2 + 4, thinking


def test_the_infill_sampler_is_accepted_by_name_and_letter(base_url: str) -> None:
    for samplers in (["top_k", "infill", "temperature"], "kit"):
        body = {"prompt": "def add(a, b):", "n_predict": 4, "samplers": samplers}
        r = httpx.post(f"{base_url}/completion", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["generation_settings"]["samplers"] == ["top_k", "infill", "temperature"]
    # Over the whole vocabulary it would stall every slot for seconds per token: refused.
    r = httpx.post(f"{base_url}/completion", json={"prompt": "x", "n_predict": 1, "samplers": ["infill"]}, timeout=60)
    assert r.status_code == 400 and "infill" in r.json()["error"]["message"]


def test_unknown_fields_are_ignored(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
        user="u-1",
        metadata={"k": "v"},
        store=True,
        extra_body={"no_such_field": 1},
    )
    assert r.choices[0].message is not None


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """all-MiniLM-L6-v2 (384 dimensions) with --embedding, as test_embeddings_rerank_infill.py starts it."""
    embed_gguf, _ = cached_models()
    srv = start_server(
        ["-m", str(embed_gguf), "--embedding", "-np", "1", "-c", "512"], tmp_path_factory.mktemp("embed")
    )
    yield srv
    stop_server(srv)


def test_embedding_dimensions_other_than_the_models_are_refused(embedding_server: RunningServer) -> None:
    url = f"{embedding_server.url}/v1/embeddings"
    same = httpx.post(url, json={"input": "hi", "dimensions": MINILM_DIMENSIONS}, timeout=30)
    assert same.status_code == 200, same.text
    assert len(same.json()["data"][0]["embedding"]) == MINILM_DIMENSIONS
    for dimensions in (7, MINILM_DIMENSIONS - 1, MINILM_DIMENSIONS + 1):
        r = httpx.post(url, json={"input": "hi", "dimensions": dimensions}, timeout=30)
        assert r.status_code == 400, f"dimensions {dimensions}: {r.status_code} {r.text[:200]}"
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("dimensions:") and f"{MINILM_DIMENSIONS} dimensions" in error["message"]


def test_embeddings_on_a_server_started_without_them_are_a_501(base_url: str) -> None:
    r = httpx.post(f"{base_url}/v1/embeddings", json={"input": "hi", "dimensions": 7}, timeout=30)
    assert r.status_code == 501, r.text
    assert r.json()["error"]["type"] == "not_supported_error"


# ------------------------------------------------------------------ fuzzing
class BackgroundStream:
    """A long native stream that runs while the fuzzer sends its bodies."""

    def __init__(self, base_url: str) -> None:
        self.status = 0
        self.events: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._run, args=(base_url,), daemon=True)
        self.thread.start()

    def _run(self, base_url: str) -> None:
        body = {"prompt": "Count to one hundred:", "n_predict": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{base_url}/completion", json=body, timeout=600) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))


@pytest.fixture(scope="module")
def background_stream(base_url: str) -> BackgroundStream:
    return BackgroundStream(base_url)


@pytest.fixture(scope="module")
def fuzz_http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as http:
        yield http


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(route=st.sampled_from(POST_ROUTES), body=bodies)
def test_fuzzed_bodies_never_get_a_5xx(
    base_url: str, background_stream: BackgroundStream, fuzz_http: httpx.Client, route: str, body: bytes
) -> None:
    r = fuzz_http.post(f"{base_url}{route}", content=body, headers={"content-type": "application/json"})
    # 501 is llama-server's answer for a feature this server was not started with (embeddings here).
    not_started = r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    assert 200 <= r.status_code < 500 or not_started, (route, r.status_code, body[:200], r.text[:300])
    if r.status_code >= 400:
        payload = r.json()  # every refusal is the family's JSON error envelope
        assert "error" in payload, payload


def test_the_stream_beside_the_fuzzing_completed_intact(background_stream: BackgroundStream) -> None:
    background_stream.thread.join(timeout=600)
    assert background_stream.status == 200
    events = background_stream.events
    assert events and events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 400
    assert sum(len(e.get("tokens", [])) for e in events[:-1]) == 400
