"""The OpenAI surface through the official SDK, against SmolLM2."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import openai
import pytest

GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="none", max_retries=0, timeout=120)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_chat_completion_has_text_usage_and_timings(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="any", messages=ask("What is the capital of France?"), max_tokens=24, **GREEDY
    )
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert r.usage is not None
    assert r.usage.prompt_tokens > 5
    assert 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    timings = (r.model_extra or {})["timings"]
    assert timings["predicted_n"] == r.usage.completion_tokens
    assert timings["prompt_n"] + timings["cache_n"] == r.usage.prompt_tokens


def test_chat_stream_equals_non_stream_and_reports_usage(client: openai.OpenAI) -> None:
    messages = ask("Name three colors.")
    whole = client.chat.completions.create(model="m", messages=messages, max_tokens=32, **GREEDY)
    chunks = list(
        client.chat.completions.create(
            model="m", messages=messages, max_tokens=32, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_completions_stream_and_not(client: openai.OpenAI) -> None:
    prompt = "The three primary colors are"
    whole = client.completions.create(model="m", prompt=prompt, max_tokens=20, **GREEDY)
    assert whole.object == "text_completion"
    assert whole.choices[0].text
    assert whole.usage is not None and whole.usage.completion_tokens <= 20
    streamed = list(
        client.completions.create(
            model="m", prompt=prompt, max_tokens=20, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    text = "".join(c.choices[0].text for c in streamed if c.choices)
    assert text == whole.choices[0].text
    assert streamed[-1].usage is not None


def test_max_tokens_gives_finish_reason_length(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m", messages=ask("Write a long story about a dragon."), max_tokens=5, **GREEDY
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 5


def test_stop_string_is_never_emitted(client: openai.OpenAI) -> None:
    messages = ask("Count from 1 to 10, separated by commas.")
    free = client.chat.completions.create(model="m", messages=messages, max_tokens=40, **GREEDY)
    content = free.choices[0].message.content or ""
    assert "5" in content, content
    stop = "5"
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=40, stop=[stop], **GREEDY)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == content[: content.index(stop)]
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="m", messages=messages, max_tokens=40, stop=[stop], stream=True, **GREEDY
        )
        if c.choices
    )
    assert streamed == r.choices[0].message.content


def test_prompt_cache_reports_cached_tokens(client: openai.OpenAI) -> None:
    system = "You are a helpful assistant who answers briefly. " * 8
    first = [{"role": "system", "content": system}, {"role": "user", "content": "Say hi."}]
    second = [{"role": "system", "content": system}, {"role": "user", "content": "Say bye."}]
    client.chat.completions.create(model="m", messages=first, max_tokens=4, **GREEDY)
    r = client.chat.completions.create(model="m", messages=second, max_tokens=4, **GREEDY)
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= 60
    assert (r.model_extra or {})["timings"]["cache_n"] == cached


def test_eight_concurrent_streams_match_their_solo_runs(client: openai.OpenAI) -> None:
    prompts = [f"Tell me one fact about the number {n}." for n in range(8)]

    def run(prompt: str) -> str:
        parts = []
        for c in client.chat.completions.create(
            model="m", messages=ask(prompt), max_tokens=24, stream=True, extra_body={"cache_prompt": False}, **GREEDY
        ):
            if c.choices and c.choices[0].delta.content:
                parts.append(c.choices[0].delta.content)
        return "".join(parts)

    solo = [run(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(run, prompts))
    assert all(solo), solo
    assert together == solo


def test_context_overflow_is_a_400_with_sizes(client: openai.OpenAI) -> None:
    long_text = "word " * 3000  # well past the 1024-token slot
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=ask(long_text), max_tokens=4)
    err = info.value.body
    assert isinstance(err, dict)
    assert err["type"] == "exceed_context_size_error"
    assert err["n_ctx"] == 1024 and err["n_prompt_tokens"] > 1024
    with pytest.raises(openai.BadRequestError):
        list(client.chat.completions.create(model="m", messages=ask(long_text), max_tokens=4, stream=True))


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"",
        b"[1,2,3]",
        json.dumps({"messages": []}).encode(),
        json.dumps({"messages": "hello"}).encode(),
        json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": "lots"}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": -1}).encode(),
        json.dumps({"messages": [{"role": "user", "content": "x"}], "top_k": -5}).encode(),
        '{"messages": [{"role": "user", "content": "\u4f60\u597d"}]}'.encode("gbk"),
    ],
)
def test_bad_chat_bodies_are_400_in_openai_envelope(base_url: str, body: bytes) -> None:
    r = httpx.post(
        f"{base_url}/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}, timeout=30
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == 400 and err["type"] == "invalid_request_error" and err["message"]


def test_invalid_token_ids_are_rejected(base_url: str) -> None:
    for prompt in ([1, -1, 2], [10**9], [1.5], [True]):
        r = httpx.post(f"{base_url}/completion", json={"prompt": prompt, "n_predict": 2}, timeout=30)
        assert r.status_code == 400, (prompt, r.text)
    r = httpx.post(
        f"{base_url}/v1/chat/completions",
        timeout=30,
        json={"messages": [{"role": "user", "content": "x"}], "logit_bias": {"99999999": 1}},
    )
    assert r.status_code == 400
    assert "logit_bias" in r.json()["error"]["message"]


def test_unknown_route_is_404_json(base_url: str) -> None:
    r = httpx.get(f"{base_url}/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_logit_bias_false_bans_a_token(client: openai.OpenAI, base_url: str) -> None:
    messages = ask("Reply with the single word: yes")
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=8, **GREEDY)
    content = r.choices[0].message.content or ""
    first = httpx.post(f"{base_url}/tokenize", json={"content": content}).json()["tokens"][0]
    banned = client.chat.completions.create(
        model="m", messages=messages, max_tokens=8, extra_body={"logit_bias": [[first, False]]}, **GREEDY
    )
    out = banned.choices[0].message.content or ""
    out_tokens = httpx.post(f"{base_url}/tokenize", json={"content": out}).json()["tokens"]
    assert first not in out_tokens[:1]


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    kw = dict(model="m", messages=ask("Invent a name for a cat."), max_tokens=16, temperature=1.0, seed=42)
    a = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    b = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert a.choices[0].message.content == b.choices[0].message.content
