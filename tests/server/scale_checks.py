"""What the scale-out tests share: requests through a front, SSE reading, a stream in a thread."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx

UPSTREAM = "x-llamaserve-upstream"


def chat(
    url: str, messages: list[dict[str, str]], headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def sse(url: str, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=120) as answer:
        lines = [line for line in answer.iter_lines() if line]
    return answer, lines


def data(lines: list[str]) -> list[Any]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


class Stream(threading.Thread):
    def __init__(self, url: str, session: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.session = session
        self.upstream = ""
        self.lines: list[str] = []
        self.started = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        body = {
            "messages": [{"role": "user", "content": "Write a long story."}],
            "max_tokens": 100,
            "ignore_eos": True,
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST",
                f"{self.url}/v1/chat/completions",
                json=body,
                headers={"x-session-id": self.session},
                timeout=120,
            ) as answer:
                self.upstream = answer.headers[UPSTREAM]
                for line in answer.iter_lines():
                    if line:
                        self.lines.append(line)
                        if len(self.lines) >= 3:
                            self.started.set()
        except Exception as exc:  # the test reads what the client saw
            self.error = exc
        finally:
            self.started.set()


def check_families(url: str, direct: str, members: set[str]) -> None:
    """Every API family through a front, streams included; `direct` is the chat answer of one member alone."""
    messages = [{"role": "user", "content": "Name three colors."}]
    answer = chat(url, messages)
    assert answer.status_code == 200
    assert answer.headers[UPSTREAM] in members
    assert answer.json()["choices"][0]["message"]["content"] == direct  # same model, temperature 0

    resp, lines = sse(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "stream": True})
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in data(lines) if c["choices"]) == direct

    legacy = httpx.post(f"{url}/v1/completions", json={"prompt": "Once upon", "max_tokens": 4}, timeout=60)
    assert legacy.status_code == 200 and legacy.json()["choices"][0]["text"]
    _, lines = sse(url, "/completion", {"prompt": "Once upon", "n_predict": 4, "stream": True})
    chunks = data(lines)
    assert chunks[-1]["stop"] is True and "".join(c["content"] for c in chunks)

    body = {"model": "x", "max_tokens": 6, "messages": messages, "stream": True}
    _, lines = sse(url, "/v1/messages", body)
    events = [line[7:] for line in lines if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"

    _, lines = sse(url, "/v1/responses", {"input": "Name a color.", "max_output_tokens": 6, "stream": True})
    done = [d for d in data(lines) if d.get("type") in ("response.completed", "response.incomplete")]
    assert len(done) == 1
    first_id = done[0]["response"]["id"]
    # The chain continues on the server that stored the first response, whichever that was.
    first = httpx.get(f"{url}/v1/responses/{first_id}", timeout=30)
    assert first.status_code == 200 and first.json()["id"] == first_id
    for _ in range(3):
        follow = httpx.post(
            f"{url}/v1/responses",
            json={"input": "And another?", "previous_response_id": first_id, "max_output_tokens": 6},
            timeout=60,
        )
        assert follow.status_code == 200, follow.text
        assert follow.headers[UPSTREAM] == first.headers[UPSTREAM]

    tokens = httpx.post(f"{url}/tokenize", json={"content": "hello world"}, timeout=30).json()["tokens"]
    assert tokens and httpx.post(f"{url}/detokenize", json={"tokens": tokens}, timeout=30).json()["content"]
    assert httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    assert httpx.get(f"{url}/health", timeout=30).json() == {"status": "ok"}


def check_prefix_sessions(url: str, members: set[str]) -> None:
    """Three conversations, three turns each, interleaved, with no session header: the prefix routes them."""
    topics = ["the sea", "mountains", "old trains"]
    history = {t: [{"role": "system", "content": f"You are a guide who only talks about {t}. " * 8}] for t in topics}
    seen: dict[str, list[str]] = {t: [] for t in topics}
    cached: dict[str, list[int]] = {t: [] for t in topics}
    for turn in range(3):
        for topic in topics:
            history[topic].append({"role": "user", "content": f"Tell me fact number {turn + 1}."})
            answer = chat(url, history[topic])
            assert answer.status_code == 200
            body = answer.json()
            history[topic].append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
            seen[topic].append(answer.headers[UPSTREAM])
            cached[topic].append(body["timings"]["cache_n"])
    for topic in topics:
        assert len(set(seen[topic])) == 1, seen
        assert cached[topic][0] < cached[topic][1] < cached[topic][2], cached
    assert {s[0] for s in seen.values()} == members  # both servers used

    # A session header keeps a conversation together even when its prompts share nothing.
    headers = {"x-session-id": "talk-1"}
    places = {chat(url, [{"role": "user", "content": f"Say {w}."}], headers).headers[UPSTREAM] for w in "abc"}
    assert len(places) == 1
