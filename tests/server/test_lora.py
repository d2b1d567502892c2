"""LoRA adapters on the real model, with an adapter GGUF written by the test."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.lora_adapter import write_random_lora

from .conftest import RunningServer, start_server, stop_server

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def lora_server(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("lora")
    adapter = tmp / "random-lora.gguf"
    write_random_lora(model_path, str(adapter), seed=0)
    srv = start_server(
        ["-m", model_path, "-np", "2", "-c", "2048", "-t", "2", "--lora", str(adapter), "--lora-init-without-apply"],
        tmp,
    )
    yield srv
    stop_server(srv)


def complete(url: str, **extra: Any) -> str:
    body = {"prompt": PROMPT, "n_predict": 10, "temperature": 0, **extra}
    r = httpx.post(f"{url}/completion", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return str(r.json()["content"])


def set_global(url: str, scale: float) -> None:
    r = httpx.post(f"{url}/lora-adapters", json=[{"id": 0, "scale": scale}], timeout=30)
    assert r.status_code == 200 and r.json() == {"success": True}


def test_scales_global_and_per_request(lora_server: RunningServer, model_path: str, tmp_path: Path) -> None:
    url = lora_server.url
    listed = httpx.get(f"{url}/lora-adapters", timeout=30).json()
    assert listed == [{"id": 0, "path": listed[0]["path"], "scale": 0.0}]
    assert listed[0]["path"].endswith("random-lora.gguf")

    base = complete(url)  # --lora-init-without-apply: the global scale is 0
    assert complete(url, lora=[{"id": 0, "scale": 0.0}]) == base
    applied = complete(url, lora=[{"id": 0, "scale": 1.0}])
    assert applied != base

    set_global(url, 1.0)
    try:
        assert httpx.get(f"{url}/lora-adapters", timeout=30).json()[0]["scale"] == 1.0
        assert complete(url) == applied  # the global scale now applies
        assert complete(url, lora=[{"id": 0, "scale": 0.0}]) == base  # the request's field wins
        assert complete(url, lora=[]) == base  # adapters a request does not list are off
    finally:
        set_global(url, 0.0)

    # The base model on a server without adapters agrees with scale 0.
    plain = start_server(["-m", model_path, "-np", "1", "-c", "2048", "-t", "2"], tmp_path)
    try:
        assert complete(plain.url) == base
    finally:
        stop_server(plain)


def test_different_scales_at_once_each_get_their_own_answer(lora_server: RunningServer) -> None:
    """A request under the adapter and one without, running together, answer as each does alone.

    (Two requests with the same adapter may share a decode; with the adapter's
    float32 matmuls a 2-row batch rounds differently from a 1-row one, so
    only differing sets are compared with their lone answers.)
    """
    url = lora_server.url
    alone = {s: complete(url, lora=[{"id": 0, "scale": s}], cache_prompt=False) for s in (0.0, 1.0)}
    for _ in range(2):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = {
                s: pool.submit(complete, url, lora=[{"id": 0, "scale": s}], cache_prompt=False) for s in (1.0, 0.0)
            }
            assert {s: f.result() for s, f in futures.items()} == alone


@pytest.mark.parametrize(
    "lora", [[{"id": 3, "scale": 1.0}], [{"id": 0}], "x", [{"id": 0, "scale": "big"}], [{"id": True, "scale": 1}]]
)
def test_bad_lora_fields_are_400(lora_server: RunningServer, lora: Any) -> None:
    r = httpx.post(f"{lora_server.url}/completion", json={"prompt": "hi", "n_predict": 1, "lora": lora}, timeout=30)
    assert r.status_code == 400, r.text
    r = httpx.post(f"{lora_server.url}/lora-adapters", json=lora, timeout=30)
    assert r.status_code == 400, r.text


def test_lora_on_the_chat_route(lora_server: RunningServer) -> None:
    url = lora_server.url
    body = {"messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 8, "temperature": 0}
    base = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
    tuned = httpx.post(
        f"{url}/v1/chat/completions", json={**body, "lora": [{"id": 0, "scale": 1.0}]}, timeout=120
    ).json()
    assert base["choices"][0]["message"]["content"] != tuned["choices"][0]["message"]["content"]
