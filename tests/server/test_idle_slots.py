"""--cache-idle-slots: conversations taking turns on a unified KV neither fill it nor lose their cache."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.server.conftest import start_server, stop_server


def conversation(seed: int) -> str:
    # About 700 tokens of text no other conversation shares.
    return " ".join(f"w{seed}x{i}" for i in range(260))


def ask(url: str, seed: int, n_predict: int = 4) -> dict[str, Any]:
    body = {"prompt": conversation(seed), "n_predict": n_predict, "temperature": 0}
    r = httpx.post(f"{url}/completion", json=body, timeout=300)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def test_three_long_conversations_in_turn_fit_and_come_back_cached(model_path: str, tmp_path: Path) -> None:
    # The slots share 2,048 cells: two idle 700-token conversations would leave no room for a third.
    server = start_server(["-m", model_path, "-c", "2048", "-t", "2"], tmp_path)
    try:
        first = ask(server.url, 1)
        assert first["tokens_evaluated"] > 650
        ask(server.url, 2)
        ask(server.url, 3)
        again = ask(server.url, 1)  # parked in host memory when the others started, restored now
        assert again["timings"]["cache_n"] >= first["tokens_evaluated"] - 1
    finally:
        stop_server(server)


def test_verbose_log_names_each_exchange_with_the_prompt_cache(model_path: str, tmp_path: Path) -> None:
    # What an operator reading `--verbose` sees: the idle slot parked when another starts, then
    # "updating prompt cache" when its conversation comes back from host memory.
    args = ["-m", model_path, "-c", "1024", "-np", "2", "-kvu", "--cache-ram", "100", "--verbose", "-t", "2"]
    server = start_server(args, tmp_path)
    try:

        def send(seed: int, slot: int) -> dict[str, Any]:
            prompt = " ".join(f"w{seed}x{i}" for i in range(20))
            body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "id_slot": slot}
            r = httpx.post(f"{server.url}/completion", json=body, timeout=120)
            assert r.status_code == 200, r.text
            answer: dict[str, Any] = r.json()
            return answer

        first = send(1, 0)
        assert "updating prompt cache" not in server.log()
        send(2, 1)
        assert "saving idle slot to prompt cache" in server.log()
        again = send(1, -1)
        assert "updating prompt cache" in server.log()
        assert again["timings"]["cache_n"] > 0
        assert again["timings"]["prompt_n"] < first["timings"]["prompt_n"]
    finally:
        stop_server(server)


def test_concurrent_long_prompts_beyond_the_pool_wait_for_room_and_all_answer(model_path: str, tmp_path: Path) -> None:
    # Auto slots share 2,048 cells; five 700-token prompts sent at once need 3,500: started all
    # together they would overflow the pool, and llama_decode's "no memory slot" would fail them all.
    server = start_server(["-m", model_path, "-c", "2048", "-t", "2"], tmp_path)
    try:
        with ThreadPoolExecutor(5) as pool:
            answers = list(pool.map(lambda seed: ask(server.url, seed, n_predict=8), range(10, 15)))
        assert [a["tokens_predicted"] for a in answers] == [8] * 5
        assert all(a["tokens_evaluated"] > 650 for a in answers)
        slots = httpx.get(f"{server.url}/slots", timeout=30).json()
        assert len(slots) == 32  # -np auto: many sequences, one pool
    finally:
        stop_server(server)
