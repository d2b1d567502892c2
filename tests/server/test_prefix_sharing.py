"""Requests sharing a system prompt share its KV cells (engine/kv/sharing.py), on SmolLM2: the
same greedy answers streamed and not, with n > 1, as a server that computes every prompt alone
through a context shift, the sharer's cells kept through a slot erase; /props, /slots and
/metrics say so. (Against a server computing every prompt whole, greedy answers of a burst can
part after a few tokens: the shared prefix's new part is decoded apart, as on any cache hit, and
llama.cpp's CPU attention rounds by the batch and cell layout: see docs/architecture.md.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server, stop_server

# About 700 tokens, more than two of the 256-token blocks sharing is indexed by.
SYSTEM = "You answer questions about the rules below.\n" + "\n".join(
    f"Rule {i}: the {('red', 'blue', 'green', 'old')[i % 4]} door number {i * 7} stays {('open', 'shut')[i % 2]}."
    for i in range(50)
)
# Each question is over 64 tokens: a prompt's new part then goes through llama.cpp's tiled CPU
# flash attention whether the system prompt before it was computed in the same batch or
# shared, as the reference computes it; shorter parts take the row-by-row kernel, which rounds
# differently (docs/architecture.md, "Prompt cache").
_DETAIL = " Think about the doors one by one, say which rule you used, and keep the answer short." * 3
QUESTIONS = [q + _DETAIL for q in ("Which rule comes first?", "Is door 14 open?", "Name a blue door.", "How many?")]
ARGS = ["-c", "8192", "-t", "2", "--metrics", "--context-shift", "--kv-unified-per-slot", "1024"]


@pytest.fixture(scope="module")
def servers(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningServer]]:
    tmp = tmp_path_factory.mktemp("prefix")
    slots = tmp / "slots"
    slots.mkdir()
    started: dict[str, RunningServer] = {}
    try:
        started["shared"] = start_server(["-m", model_path, *ARGS, "--slot-save-path", str(slots)], tmp)
        started["alone"] = start_server(["-m", model_path, *ARGS, "--no-prefix-sharing"], tmp)
        yield started
    finally:
        for srv in started.values():
            stop_server(srv)


def chat(url: str, question: str, *, stream: bool, n: int) -> list[str]:
    body = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 12,
        "temperature": 0,
        "n": n,
        "stream": stream,
    }
    if not stream:
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return [c["message"]["content"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]
    texts = [""] * n
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    texts[choice["index"]] += choice["delta"].get("content") or ""
    return texts


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def complete(url: str, prompt: str, **kw: Any) -> dict[str, Any]:
    r = httpx.post(f"{url}/completion", json={"prompt": prompt, "temperature": 0, **kw}, timeout=300)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def test_sessions_sharing_a_system_prompt_compute_it_once_and_hold_it_once(servers: dict[str, RunningServer]) -> None:
    # Four sessions at once, two questions each asked streamed and not, with n = 2 and 1: the
    # first prompt's prefill writes the system prompt, the others wait for it and share it.
    shared_url, alone_url = servers["shared"].url, servers["alone"].url
    before = metric(shared_url, "llamaserve:prompt_tokens_shared_total")
    asks = [(QUESTIONS[0], True, 2), (QUESTIONS[0], False, 2), (QUESTIONS[1], True, 1), (QUESTIONS[1], False, 1)]
    with ThreadPoolExecutor(len(asks)) as pool:
        futures = [pool.submit(chat, shared_url, q, stream=st, n=n) for q, st, n in asks]
        shared = [f.result() for f in futures]
    cells_shared = metric(shared_url, "llamaserve:kv_cells_used")
    n_system = len(httpx.post(f"{shared_url}/tokenize", json={"content": SYSTEM}, timeout=30).json()["tokens"])
    assert [len(texts) for texts in shared] == [2, 2, 1, 1] and all(t for texts in shared for t in texts)
    assert len(set(shared[0])) == 1 and len(set(shared[1])) == 1  # greedy choices of one prompt agree
    # The system prompt was computed once and shared by the three other sessions.
    assert metric(shared_url, "llamaserve:prompt_tokens_shared_total") - before >= 3 * 512
    assert metric(alone_url, "llamaserve:prompt_tokens_shared_total") == 0
    # Six sequences answered, each holding the system prompt: the cells in use hold it once.
    assert n_system <= cells_shared < 2 * n_system, (cells_shared, n_system)


def test_props_and_slots_say_whether_prefixes_are_shared(servers: dict[str, RunningServer]) -> None:
    on = httpx.get(f"{servers['shared'].url}/props", timeout=30).json()
    off = httpx.get(f"{servers['alone'].url}/props", timeout=30).json()
    assert on["prefix_sharing"] is True and on["prefix_sharing_note"] == ""
    assert off["prefix_sharing"] is False and "--no-prefix-sharing" in off["prefix_sharing_note"]
    used = [s for s in httpx.get(f"{servers['shared'].url}/slots", timeout=30).json() if "id_task" in s]
    assert used and all("n_prompt_tokens_shared" in s for s in used)


def test_a_context_shift_beside_a_shared_prefix_keeps_both_answers_going(servers: dict[str, RunningServer]) -> None:
    # Each slot holds 1,024 tokens: the answers run past that and shift, n_keep 0 cutting into
    # the shared system prompt (the shifting slot first gets cells of its own).
    def run(url: str) -> list[dict[str, Any]]:
        prompts = [f"{SYSTEM}\nQuestion: {q}\nAnswer:" for q in QUESTIONS[:2]]
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(complete, url, p, n_predict=420, n_keep=0, ignore_eos=True) for p in prompts]
            return [f.result() for f in futures]

    url = servers["shared"].url
    before = metric(url, "llamaserve:prompt_tokens_shared_total")
    shared = run(url)
    assert all(a["truncated"] and a["tokens_predicted"] == 420 for a in shared)
    assert metric(url, "llamaserve:prompt_tokens_shared_total") - before >= 512
    # Each sequence still holds the cells its tokens say: asked again, the prompt comes from
    # its slot's cache and the answer is the one it gave.
    prompt = f"{SYSTEM}\nQuestion: {QUESTIONS[0]}\nAnswer:"
    first = complete(url, prompt, n_predict=6, id_slot=5)
    again = complete(url, prompt, n_predict=6, id_slot=5)
    assert again["content"] == first["content"] and again["timings"]["cache_n"] == first["tokens_evaluated"] - 1


def test_erasing_the_slot_that_lent_its_prefix_keeps_the_sharers_cells(servers: dict[str, RunningServer]) -> None:
    url = servers["shared"].url
    prompts = [f"{SYSTEM}\nQuestion: {q}\nAnswer:" for q in QUESTIONS[2:]]
    complete(url, prompts[0], n_predict=4, id_slot=0)
    first = complete(url, prompts[1], n_predict=8, id_slot=1)
    assert first["timings"]["cache_n"] >= 512  # shared from slot 0
    r = httpx.post(f"{url}/slots/0?action=erase", json={}, timeout=30)
    assert r.status_code == 200, r.text
    again = complete(url, prompts[1], n_predict=8, id_slot=1)
    assert again["content"] == first["content"]
    assert again["timings"]["cache_n"] == first["tokens_evaluated"] - 1
