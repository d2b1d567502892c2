"""--sleep-idle-seconds on the real model: memory goes back, exempt routes stay asleep, tasks wake it once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from .conftest import RunningServer, start_server, stop_server

MiB = 1 << 20
CHAT = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "temperature": 0}
WAKE_LINE = "waking up: model reloaded"
SLEEP_LINE = "sleeping after"


def rss(server: RunningServer) -> int:
    with open(f"/proc/{server.process.pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def is_sleeping(server: RunningServer) -> bool:
    r = httpx.get(f"{server.url}/props", timeout=30)
    assert r.status_code == 200
    return bool(r.json()["is_sleeping"])


def wait_asleep(server: RunningServer, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not is_sleeping(server):
        assert time.time() < deadline, f"never fell asleep:\n{server.log()}"
        time.sleep(0.2)


def wait_freed(server: RunningServer, n_sleeps: int, timeout: float = 30.0) -> None:
    """Until the log says the n-th sleep has freed the model: /props reports sleeping as soon as
    the model is detached, and the freeing runs after it in a worker thread."""
    deadline = time.time() + timeout
    while server.log().count(SLEEP_LINE) < n_sleeps:
        assert time.time() < deadline, f"the model was never freed:\n{server.log()}"
        time.sleep(0.2)


def chat_text(server: RunningServer) -> str:
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=120)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


@pytest.fixture(scope="module")
def sleepy(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # -c 4096: a KV cache of ~94 MiB on top of the ~94 MiB of weights, so freeing is plainly visible.
    srv = start_server(
        ["-m", model_path, "-c", "4096", "-np", "2", "-t", "1", "--metrics", "--sleep-idle-seconds", "2"],
        tmp_path_factory.mktemp("sleepy"),
    )
    yield srv
    stop_server(srv)


def test_sleep_frees_memory_and_the_next_task_wakes_it(sleepy: RunningServer) -> None:
    before = chat_text(sleepy)
    awake_rss = rss(sleepy)
    assert is_sleeping(sleepy) is False
    metrics_awake = httpx.get(f"{sleepy.url}/metrics").text
    assert "llamacpp:tokens_predicted_total 8" in metrics_awake

    wait_asleep(sleepy)
    wait_freed(sleepy, 1)
    asleep_rss = rss(sleepy)
    # Measured: ~290 MiB awake, ~90 MiB asleep (weights, KV cache and compute buffers gone).
    assert awake_rss - asleep_rss > 100 * MiB, (awake_rss // MiB, asleep_rss // MiB)
    assert asleep_rss < 0.6 * awake_rss, (awake_rss // MiB, asleep_rss // MiB)

    # Exempt routes answer without waking: /health is llama-server's plain body, the rest are cached.
    for _ in range(3):
        h = httpx.get(f"{sleepy.url}/health")
        assert h.status_code == 200 and h.json() == {"status": "ok"}
        time.sleep(0.3)
    models = httpx.get(f"{sleepy.url}/v1/models").json()
    assert models["data"][0]["meta"]["n_ctx"] == 2048
    metrics = httpx.get(f"{sleepy.url}/metrics")
    assert metrics.status_code == 200 and "llamacpp:tokens_predicted_total 8" in metrics.text
    assert is_sleeping(sleepy) is True
    assert rss(sleepy) < asleep_rss + 20 * MiB
    assert WAKE_LINE not in sleepy.log()

    # The next task reloads transparently and answers exactly as before.
    assert chat_text(sleepy) == before
    assert is_sleeping(sleepy) is False
    assert sleepy.log().count(WAKE_LINE) == 1
    # The counters carried over the reload (monotonic for Prometheus).
    assert "llamacpp:tokens_predicted_total 16" in httpx.get(f"{sleepy.url}/metrics").text


def test_concurrent_tasks_share_one_reload(sleepy: RunningServer) -> None:
    wait_asleep(sleepy)
    wakes = sleepy.log().count(WAKE_LINE)
    results: list[str | BaseException] = []

    def ask() -> None:
        try:
            results.append(chat_text(sleepy))
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and all(isinstance(r, str) and r for r in results), results
    assert results[0] == results[1]
    assert sleepy.log().count(WAKE_LINE) == wakes + 1


@pytest.fixture(scope="module")
def light_sleeper(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(
        ["-m", model_path, "-c", "1024", "-np", "1", "-t", "1", "--sleep-idle-seconds", "1"],
        tmp_path_factory.mktemp("light"),
    )
    yield srv
    stop_server(srv)


def test_a_stream_longer_than_the_idle_time_is_never_put_to_sleep(light_sleeper: RunningServer) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 200, "ignore_eos": True, "stream": True, "temperature": 0}
    t0 = time.perf_counter()
    chunks: list[dict[str, object]] = []
    with httpx.stream("POST", f"{light_sleeper.url}/completion", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
    elapsed = time.perf_counter() - t0
    assert is_sleeping(light_sleeper) is False
    assert elapsed > 1.0, "the stream must outlast the idle time for this test to mean anything"
    assert chunks[-1]["stop"] is True and chunks[-1]["tokens_predicted"] == 200
    assert SLEEP_LINE not in light_sleeper.log()
    wait_asleep(light_sleeper)  # and once it is over, the clock runs again
