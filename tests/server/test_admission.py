"""The bounded queue and request priority over HTTP: a 429 with Retry-After past --max-queue
(in each API family's error shape), every admitted request answered, and the counters."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.server.conftest import start_server, stop_server


def test_past_max_queue_requests_get_429_and_admitted_ones_complete(model_path: str, tmp_path: Path) -> None:
    server = start_server(
        ["-m", model_path, "-np", "1", "--max-queue", "1", "-c", "1024", "-t", "2", "--metrics"], tmp_path
    )
    url = server.url
    answers: dict[str, httpx.Response] = {}
    stop_streaming = threading.Event()
    streamed_tokens: list[str] = []

    def keep_a_slot_busy() -> None:
        # A long stream holds the only slot until the checks are done, on a fast machine or a slow one.
        body = {"prompt": "Once upon a time", "n_predict": 900, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/completion", json=body, timeout=300) as r:
            for line in r.iter_lines():
                streamed_tokens.append(line)
                if stop_streaming.is_set():
                    return

    def send(name: str, body: dict[str, Any]) -> None:
        answers[name] = httpx.post(f"{url}/completion", json=body, timeout=300)

    try:
        running = threading.Thread(target=keep_a_slot_busy)
        running.start()
        deadline = time.time() + 120
        while not streamed_tokens:
            assert time.time() < deadline, "the first request never started"
            time.sleep(0.02)
        queued = threading.Thread(target=send, args=("queued", {"prompt": "Hi", "n_predict": 4, "priority": 3}))
        queued.start()
        while b"llamacpp:requests_deferred 1" not in httpx.get(f"{url}/metrics").content:
            assert time.time() < deadline, "the second request never queued"
            time.sleep(0.02)

        refused = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == 429 and error["type"] == "rate_limit_error"
        assert "--max-queue 1" in error["message"]

        streamed = httpx.post(
            f"{url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True},
            timeout=30,
        )
        assert streamed.status_code == 429 and "retry-after" in streamed.headers

        anthropic = httpx.post(
            f"{url}/v1/messages",
            json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
            timeout=30,
        )
        assert anthropic.status_code == 429 and "retry-after" in anthropic.headers
        assert anthropic.json() == {"type": "error", "error": {"type": "rate_limit_error", "message": error["message"]}}

        stop_streaming.set()  # the client goes away: its slot is freed for the waiting request
        running.join(timeout=300)
        queued.join(timeout=300)
        assert answers["queued"].status_code == 200
        assert answers["queued"].json()["timings"]["queue_ms"] > 0
        metrics = httpx.get(f"{url}/metrics").text
        assert "llamaserve:requests_rejected_total 3.0" in metrics
        assert "llamaserve:queue_seconds_total" in metrics
        # With the queue empty again, a request is admitted.
        again = httpx.post(f"{url}/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=60)
        assert again.status_code == 200
    finally:
        stop_server(server)


def test_priority_must_be_an_integer(server: Any) -> None:
    r = httpx.post(f"{server.url}/completion", json={"prompt": "Hi", "n_predict": 1, "priority": "high"}, timeout=30)
    assert r.status_code == 400 and "priority" in r.json()["error"]["message"]
    ok = httpx.post(f"{server.url}/completion", json={"prompt": "Hi", "n_predict": 1, "priority": -5}, timeout=30)
    assert ok.status_code == 200
