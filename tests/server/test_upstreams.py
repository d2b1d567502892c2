"""`--upstreams`: one front (no model) in front of two of our SmolLM2 servers.

Every API family answers through the front, streams included; a multi-turn conversation
sharing its prefix stays on one server, whose prompt cache grows turn by turn; a server
killed mid-stream fails only its own stream, the other keeps serving, and once restarted
it is taken back.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server, stop_server

UPSTREAM = "x-llamaserve-upstream"


@dataclass
class Cluster:
    front: RunningServer
    members: list[RunningServer]
    tmp: Path
    member_args: list[list[str]] = field(default_factory=list)


def _member_args(model_path: str, tmp: Path, i: int) -> list[str]:
    return ["-m", model_path, "-t", "1", "-np", "2", "-c", "4096", "--temp", "0", "--metrics"] + [
        "--responses-db",
        str(tmp / f"responses-{i}.sqlite3"),
    ]


@pytest.fixture(scope="module")
def cluster(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("upstreams")
    args = [_member_args(model_path, tmp, i) for i in range(2)]
    members = [start_server(a, tmp) for a in args]
    front = start_server(["--upstreams", ",".join(m.url for m in members), "--metrics"], tmp)
    cl = Cluster(front, members, tmp, args)
    yield cl
    stop_server(cl.front)
    for member in cl.members:
        stop_server(member)


def _chat(
    url: str, messages: list[dict[str, str]], headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def _sse(url: str, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[str]]:
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=120) as answer:
        lines = [line for line in answer.iter_lines() if line]
    return answer, lines


def _data(lines: list[str]) -> list[Any]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def test_every_api_family_answers_through_the_front(cluster: Cluster) -> None:
    url = cluster.front.url
    messages = [{"role": "user", "content": "Name three colors."}]
    direct = _chat(cluster.members[0].url, messages).json()["choices"][0]["message"]["content"]
    answer = _chat(url, messages)
    assert answer.status_code == 200
    assert answer.headers[UPSTREAM] in {m.url for m in cluster.members}
    assert answer.json()["choices"][0]["message"]["content"] == direct  # same model, temperature 0

    resp, lines = _sse(url, "/v1/chat/completions", {"messages": messages, "max_tokens": 6, "stream": True})
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert lines[-1] == "data: [DONE]"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in _data(lines) if c["choices"]) == direct

    legacy = httpx.post(f"{url}/v1/completions", json={"prompt": "Once upon", "max_tokens": 4}, timeout=60)
    assert legacy.status_code == 200 and legacy.json()["choices"][0]["text"]
    _, lines = _sse(url, "/completion", {"prompt": "Once upon", "n_predict": 4, "stream": True})
    chunks = _data(lines)
    assert chunks[-1]["stop"] is True and "".join(c["content"] for c in chunks)

    body = {"model": "x", "max_tokens": 6, "messages": messages, "stream": True}
    _, lines = _sse(url, "/v1/messages", body)
    events = [line[7:] for line in lines if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"

    _, lines = _sse(url, "/v1/responses", {"input": "Name a color.", "max_output_tokens": 6, "stream": True})
    done = [d for d in _data(lines) if d.get("type") in ("response.completed", "response.incomplete")]
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
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert "llamaserve:upstreams_healthy 2" in metrics
    for member in cluster.members:
        assert f'llamacpp:prompt_tokens_total{{upstream="{member.url}"}}' in metrics

    bad = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", timeout=30)
    assert bad.status_code == 400 and "error" in bad.json()


def test_conversations_sharing_a_prefix_stay_on_one_server(cluster: Cluster) -> None:
    """Four conversations, three turns each, interleaved, with no session header: the prefix routes them."""
    url = cluster.front.url
    topics = ["the sea", "mountains", "old trains", "city parks"]
    history = {t: [{"role": "system", "content": f"You are a guide who only talks about {t}. " * 8}] for t in topics}
    seen: dict[str, list[str]] = {t: [] for t in topics}
    cached: dict[str, list[int]] = {t: [] for t in topics}
    for turn in range(3):
        for topic in topics:
            history[topic].append({"role": "user", "content": f"Tell me fact number {turn + 1}."})
            answer = _chat(url, history[topic])
            assert answer.status_code == 200
            body = answer.json()
            history[topic].append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
            seen[topic].append(answer.headers[UPSTREAM])
            cached[topic].append(body["timings"]["cache_n"])
    for topic in topics:
        assert len(set(seen[topic])) == 1, seen
        assert cached[topic][0] < cached[topic][1] < cached[topic][2], cached
    assert {s[0] for s in seen.values()} == {m.url for m in cluster.members}  # both servers used

    # A session header keeps a conversation together even when its prompts share nothing.
    headers = {"x-session-id": "talk-1"}
    places = {_chat(url, [{"role": "user", "content": f"Say {w}."}], headers).headers[UPSTREAM] for w in "abc"}
    assert len(places) == 1


class _Stream(threading.Thread):
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
            "max_tokens": 160,
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


def test_a_server_killed_mid_stream_fails_only_its_own_stream(cluster: Cluster) -> None:
    url = cluster.front.url
    streams = [_Stream(url, f"story-{i}") for i in range(2)]
    for s in streams:
        s.start()
        assert s.started.wait(60)
    by_url = {m.url: m for m in cluster.members}
    assert {s.upstream for s in streams} == set(by_url)  # one stream on each server
    victim_url = streams[1].upstream
    victim = by_url[victim_url]
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait(10)
    for s in streams:
        s.join(120)
    survivor, killed = streams
    assert survivor.error is None and survivor.lines[-1] == "data: [DONE]"
    assert len(_data(survivor.lines)) > 150
    assert killed.lines[-1] != "data: [DONE]"
    error = json.loads(killed.lines[-1][6:])
    assert "error" in error and "stopped" in error["error"]["message"]

    # The front keeps serving on the other server, the dead one's requests included.
    for i in range(4):
        answer = _chat(url, [{"role": "user", "content": f"Count to {i + 2}."}], {"x-session-id": "story-1"})
        assert answer.status_code == 200
        assert answer.headers[UPSTREAM] == survivor.upstream

    # Restarted on its port, the server is probed back in and gets requests again.
    index = cluster.members.index(victim)
    port = int(victim_url.rsplit(":", 1)[1])
    cluster.members[index] = start_server(cluster.member_args[index], cluster.tmp, port=port)
    deadline = time.time() + 30
    while "llamaserve:upstreams_healthy 2" not in httpx.get(f"{url}/metrics", timeout=10).text:
        assert time.time() < deadline, "the restarted server was not taken back"
        time.sleep(0.2)
    places = {_chat(url, [{"role": "user", "content": f"Hi {i}"}]).headers[UPSTREAM] for i in range(4)}
    assert victim_url in places
