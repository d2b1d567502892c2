"""KV-cache management on the real model: slot files, the host-memory prompt
cache, chunk reuse, context shift and caches that survive a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import RunningServer, start_server, stop_server

FIRST_NAMES = ["Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun"]
CITIES = ["Lisbon", "Oslo", "Quito", "Perth", "Cairo", "Lima", "Riga", "Hanoi", "Tunis", "Dakar"]


def long_text(n_items: int, seed: int = 0) -> str:
    """Varied prose: about 11 tokens per item for SmolLM2's tokenizer."""
    rows = []
    for i in range(n_items):
        name = FIRST_NAMES[(i * 7 + seed) % 10]
        city = CITIES[(i * 3 + seed) % 10]
        rows.append(f"Record {i + seed * 1000}: {name} moved to {city} in {1900 + (i * 13 + seed) % 120}.")
    return "\n".join(rows) + "\n"


def tokens_of(url: str, text: str) -> list[int]:
    return list(httpx.post(f"{url}/tokenize", json={"content": text}, timeout=60).json()["tokens"])


def n_tokens(url: str, text: str) -> int:
    return len(tokens_of(url, text))


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in /metrics")


def complete(url: str, prompt: str, **extra: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "cache_prompt": True, **extra}
    r = httpx.post(f"{url}/completion", json=body, timeout=900)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def one_slot(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    """One slot, so every unrelated request takes the slot over."""
    tmp = tmp_path_factory.mktemp("kv")
    saves = tmp / "slots"
    saves.mkdir()
    srv = start_server(
        [
            "-m",
            model_path,
            "-np",
            "1",
            "-c",
            "4096",
            "-t",
            "2",
            "--slot-save-path",
            str(saves),
            "--cache-ram",
            "512",
            "--metrics",
        ],
        tmp,
    )
    yield srv, saves
    stop_server(srv)


def test_save_erase_restore_gives_the_same_continuation(one_slot: tuple[RunningServer, Path]) -> None:
    srv, saves = one_slot
    url = srv.url
    prompt = long_text(20, seed=1) + "Record"
    first = complete(url, prompt, id_slot=0)
    saved = httpx.post(f"{url}/slots/0?action=save", json={"filename": "turn.bin"}, timeout=60).json()
    assert saved["id_slot"] == 0 and saved["filename"] == "turn.bin"
    assert saved["n_saved"] >= n_tokens(url, prompt) and saved["n_written"] > 0
    assert "save_ms" in saved["timings"] and (saves / "turn.bin").stat().st_size == saved["n_written"]

    erased = httpx.post(f"{url}/slots/0?action=erase", timeout=60).json()
    assert erased == {"id_slot": 0, "n_erased": saved["n_saved"]}
    slot = httpx.get(f"{url}/slots", timeout=10).json()[0]
    assert slot["id"] == 0

    restored = httpx.post(f"{url}/slots/0?action=restore", json={"filename": "turn.bin"}, timeout=60).json()
    assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
    assert "restore_ms" in restored["timings"]
    again = complete(url, prompt, id_slot=0)
    assert again["content"] == first["content"]
    assert again["timings"]["cache_n"] == n_tokens(url, prompt) - 1  # only the last token is decoded again


def test_a_follow_up_just_short_of_a_flash_attention_tile_is_padded_to_one(
    one_slot: tuple[RunningServer, Path],
) -> None:
    """On the CPU, 52-63 new tokens are decoded with cached ones up to 64 (engine/kv/reuse.pad_prefill)."""
    url = one_slot[0].url
    prompt = long_text(20, seed=11)  # a seed no other test of the module starts its prompts with
    complete(url, prompt)
    cached = tokens_of(url, prompt)
    text = prompt
    # About 20 tokens an item: 60 new tokens (padded), then 40 and 79 (each decoded as they come).
    for seed, (n_items, padded) in enumerate(((3, True), (2, False), (4, False)), start=12):
        text += long_text(n_items, seed=seed)
        tokens = tokens_of(url, text)
        n_new = len(tokens) - next(i for i, (a, b) in enumerate(zip(cached + [-1], tokens)) if a != b)
        assert (52 <= n_new < 64) == padded, n_new  # the text gives the counts this test is about
        timings = complete(url, text)["timings"]
        if padded:
            assert timings["prompt_n"] == 64
        else:  # the 8 tokens generated last time may match the start of the new text
            assert n_new - 8 <= timings["prompt_n"] <= n_new
        assert timings["cache_n"] + timings["prompt_n"] == len(tokens)
        cached = tokens


@pytest.mark.parametrize(
    "body,query,status",
    [
        ({"filename": "../escape.bin"}, "action=save", 400),
        ({"filename": "a/b.bin"}, "action=save", 400),
        ({"filename": ".hidden"}, "action=save", 400),
        ({}, "action=save", 400),
        ({"filename": "missing.bin"}, "action=restore", 400),
        ({"filename": "x.bin"}, "action=explode", 400),
        ({"filename": "x.bin"}, "", 400),
    ],
)
def test_bad_slot_actions_are_400s(
    one_slot: tuple[RunningServer, Path], body: dict[str, Any], query: str, status: int
) -> None:
    srv, saves = one_slot
    r = httpx.post(f"{srv.url}/slots/0?{query}", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert not (saves.parent / "escape.bin").exists()


def test_unknown_slot_id_is_a_400(one_slot: tuple[RunningServer, Path]) -> None:
    r = httpx.post(f"{one_slot[0].url}/slots/7?action=erase", timeout=30)
    assert r.status_code == 400 and "slot" in r.json()["error"]["message"]


def test_slot_actions_without_a_save_path_are_501(base_url: str) -> None:
    r = httpx.post(f"{base_url}/slots/0?action=save", json={"filename": "a.bin"}, timeout=30)
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


def test_cache_ram_serves_a_prefix_after_the_slot_was_taken_over(one_slot: tuple[RunningServer, Path]) -> None:
    url = one_slot[0].url
    shared = long_text(95, seed=2)
    assert n_tokens(url, shared) >= 1000
    complete(url, shared + "Question one: who moved to Oslo?")
    other = complete(url, long_text(10, seed=3) + "Something else entirely.")
    assert other["timings"]["cache_n"] < 50  # the one slot now holds an unrelated prompt
    hits_before = metric(url, "llamaserve:prompt_cache_hits_total")
    second = complete(url, shared + "Question two: who moved to Lima?")
    assert second["timings"]["cache_n"] >= 1000
    assert metric(url, "llamaserve:prompt_cache_hits_total") == hits_before + 1
    assert metric(url, "llamaserve:prompt_cache_bytes") > 1000 * 20_000  # SmolLM2: ~23 KB of KV per token


def test_cache_reuse_keeps_a_chunk_that_moved(model_path: str, tmp_path: Path) -> None:
    srv = start_server(
        ["-m", model_path, "-np", "1", "-c", "4096", "-t", "2", "--cache-reuse", "64", "--cache-ram", "0"], tmp_path
    )
    try:
        head, middle, doc = "Notes:\n", long_text(12, seed=4), long_text(30, seed=5)
        complete(srv.url, head + middle + doc + "Summary:")
        dropped = complete(srv.url, head + doc + "Summary:")
        n_doc = n_tokens(srv.url, doc)
        assert dropped["timings"]["cache_n"] >= n_doc - 2
        assert dropped["content"].strip()
        plain = complete(srv.url, head + doc + "Summary:", cache_prompt=False)
        assert plain["timings"]["cache_n"] == 0
    finally:
        stop_server(srv)


def test_context_shift_lets_a_long_generation_finish_in_a_small_slot(model_path: str, tmp_path: Path) -> None:
    srv = start_server(["-m", model_path, "-np", "1", "-c", "512", "-t", "2", "--context-shift"], tmp_path)
    try:
        r = complete(srv.url, "Once upon a time", n_predict=2000, ignore_eos=True, temperature=0.8, n_keep=4)
        assert r["tokens_predicted"] == 2000
        assert r["stop_type"] == "limit" and r["truncated"] is True
    finally:
        stop_server(srv)
    srv = start_server(["-m", model_path, "-np", "1", "-c", "512", "-t", "2"], tmp_path)
    try:
        r = complete(srv.url, "Once upon a time", n_predict=2000, ignore_eos=True, temperature=0.8)
        assert r["tokens_predicted"] < 512 and r["truncated"] is False
    finally:
        stop_server(srv)


def test_cache_persist_serves_the_first_request_after_a_restart(model_path: str, tmp_path: Path) -> None:
    saves = tmp_path / "persist"
    saves.mkdir()
    args = ["-m", model_path, "-np", "2", "-c", "4096", "-t", "2", "--slot-save-path", str(saves), "--cache-persist"]
    shared = long_text(95, seed=6)
    srv = start_server(args, tmp_path)
    try:
        complete(srv.url, shared + "First question?")
    finally:
        stop_server(srv)
    assert (saves / "llamaserve-persist.json").exists()
    srv = start_server(args, tmp_path)
    try:
        after = complete(srv.url, shared + "Second question?")
        assert after["timings"]["cache_n"] >= 1000
        assert "loaded 1 persisted slot caches" in srv.log()
    finally:
        stop_server(srv)
