"""`--upstreams`: one front (no model) in front of two of our SmolLM2 servers.

Every API family answers through the front, streams included; a multi-turn conversation
sharing its prefix stays on one server, whose prompt cache grows turn by turn; a server
killed mid-stream fails only its own stream, the other keeps serving, and once restarted
it is taken back.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server, stop_server
from tests.server.scale_checks import UPSTREAM, Stream, chat, check_families, check_prefix_sessions, data


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


def test_every_api_family_answers_through_the_front(cluster: Cluster) -> None:
    url = cluster.front.url
    messages = [{"role": "user", "content": "Name three colors."}]
    direct = chat(cluster.members[0].url, messages).json()["choices"][0]["message"]["content"]
    check_families(url, direct, {m.url for m in cluster.members})
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert "llamaserve:upstreams_healthy 2" in metrics
    for member in cluster.members:
        assert f'llamacpp:prompt_tokens_total{{upstream="{member.url}"}}' in metrics

    bad = httpx.post(f"{url}/v1/chat/completions", content=b"{not json", timeout=30)
    assert bad.status_code == 400 and "error" in bad.json()


def test_conversations_sharing_a_prefix_stay_on_one_server(cluster: Cluster) -> None:
    """Three conversations, three turns each, interleaved, with no session header: the prefix routes them."""
    url = cluster.front.url
    check_prefix_sessions(url, {m.url for m in cluster.members})


def test_a_server_killed_mid_stream_fails_only_its_own_stream(cluster: Cluster) -> None:
    url = cluster.front.url
    streams = [Stream(url, f"story-{i}") for i in range(2)]
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
    assert len(data(survivor.lines)) > 90
    assert killed.lines[-1] != "data: [DONE]"
    error = json.loads(killed.lines[-1][6:])
    assert "error" in error and "stopped" in error["error"]["message"]

    # The front keeps serving on the other server, the dead one's requests included.
    for i in range(4):
        answer = chat(url, [{"role": "user", "content": f"Count to {i + 2}."}], {"x-session-id": "story-1"})
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
    places = {chat(url, [{"role": "user", "content": f"Hi {i}"}]).headers[UPSTREAM] for i in range(4)}
    assert victim_url in places
