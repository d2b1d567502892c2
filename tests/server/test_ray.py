"""Ray Serve: `llama serve --ray --autoscale 1:2` on a two-node Ray cluster of this machine, SmolLM2 with -t 1.

The head and a worker node run on 127.0.0.1 (two raylets, explicit ports; no network
namespaces). The deployment starts with one replica; load scales it to two without a
failed request; then every API family answers through the ingress, conversations that
share a prefix stay on one replica with a growing prompt cache, and a replica killed
mid-stream fails only its own stream while Ray's replacement takes requests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import REPO
from tests.server.ray_cluster import RayCluster, start_cluster
from tests.server.scale_checks import UPSTREAM, Stream, chat, check_families, check_prefix_sessions, data

GCS_PORT = 19010
NODE_PORTS = 19020  # 19020-19099: both nodes' own ports
HTTP_PORT = 19005


@dataclass
class Deployment:
    url: str
    cli: subprocess.Popen[bytes]
    ray: RayCluster
    log: Path


def _replicas(url: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/replicas", timeout=30)
    assert answer.status_code == 200
    return list(answer.json()["replicas"])


@pytest.fixture(scope="module")
def deployment(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("ray")
    cluster = start_cluster(tmp, GCS_PORT, NODE_PORTS)
    log = tmp / "llama-serve-ray.log"
    cli: subprocess.Popen[bytes] | None = None
    try:
        env = {**os.environ, "RAY_ADDRESS": cluster.address, "LLAMASERVE_RAY_DOWNSCALE_DELAY_S": "600"}
        cmd = [
            sys.executable,
            "-c",
            "import sys; from llamaserve.unified_cli import llama_main; sys.exit(llama_main())",
        ]
        cmd += ["serve", "--ray", "--autoscale", "1:2", "-m", model_path, "-t", "1", "-np", "2", "-c", "4096"]
        cmd += ["--temp", "0", "--metrics", "--responses-db", str(tmp / "responses.sqlite3"), "--port", str(HTTP_PORT)]
        with open(log, "wb") as out:
            cli = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{HTTP_PORT}"
        deadline = time.time() + 150
        while True:
            assert cli.poll() is None, log.read_text()
            assert time.time() < deadline, log.read_text()
            try:
                if httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield Deployment(url, cli, cluster, log)
    finally:
        if cli is not None and cli.poll() is None:
            cli.send_signal(signal.SIGTERM)
            try:
                cli.wait(5)
            except subprocess.TimeoutExpired:
                cli.kill()
        cluster.stop()


def test_load_scales_one_replica_to_two_without_a_failed_request(deployment: Deployment) -> None:
    url = deployment.url
    assert len(_replicas(url)) == 1
    stop = threading.Event()
    failures: list[str] = []
    done: list[str] = []

    def client(i: int) -> None:
        while not stop.is_set():
            body = {"messages": [{"role": "user", "content": f"Story {i}"}], "max_tokens": 24, "stream": True}
            try:
                with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as answer:
                    lines = [line for line in answer.iter_lines() if line]
                if answer.status_code != 200 or lines[-1] != "data: [DONE]":
                    failures.append(f"{answer.status_code} {lines[-1:]}")
                else:
                    done.append(answer.headers[UPSTREAM])
            except httpx.HTTPError as exc:
                failures.append(repr(exc))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(6)]
    for t in threads:
        t.start()
    deadline = time.time() + 120
    try:
        while len({*done}) < 2:
            assert time.time() < deadline, f"no second replica served: {_replicas(url)}"
            time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert failures == []
    assert len(_replicas(url)) == 2


def test_every_api_family_answers_through_the_ingress(deployment: Deployment) -> None:
    url = deployment.url
    replicas = {r["id"] for r in _replicas(url)}
    direct = chat(url, [{"role": "user", "content": "Name three colors."}]).json()["choices"][0]["message"]["content"]
    check_families(url, direct, replicas)
    metrics = httpx.get(f"{url}/metrics", timeout=60).text
    for rid in replicas:
        assert f'llamacpp:prompt_tokens_total{{replica="{rid}"}}' in metrics


def test_conversations_sharing_a_prefix_stay_on_one_replica(deployment: Deployment) -> None:
    check_prefix_sessions(deployment.url, {r["id"] for r in _replicas(deployment.url)})


def test_a_replica_killed_mid_stream_fails_only_its_own_stream(deployment: Deployment) -> None:
    url = deployment.url
    before = {r["id"]: r["pid"] for r in _replicas(url)}
    streams = [Stream(url, f"story-{i}") for i in range(2)]
    for s in streams:
        s.start()
        assert s.started.wait(60)
    assert {s.upstream for s in streams} == set(before)  # one stream on each replica
    survivor, killed = streams
    os.kill(before[killed.upstream], signal.SIGKILL)
    for s in streams:
        s.join(120)
    assert survivor.error is None and survivor.lines[-1] == "data: [DONE]"
    assert len(data(survivor.lines)) > 90
    assert killed.lines[-1] != "data: [DONE]"
    assert "replica serving this request stopped" in killed.lines[-1]

    # Requests keep being answered while Ray replaces the replica, and the new one serves.
    deadline = time.time() + 120
    places: set[str] = set()
    i = 0
    while not places - set(before):
        assert time.time() < deadline, f"no replacement replica served: {_replicas(url)}"
        answer = chat(url, [{"role": "user", "content": f"Count to {i}."}], {"x-session-id": f"after-{i}"})
        assert answer.status_code == 200, answer.text
        places.add(answer.headers[UPSTREAM])
        i += 1
        time.sleep(0.3)
    assert killed.upstream not in {r["id"] for r in _replicas(url)}
