"""Speculative decoding on a real model: at temperature 0 the answers are token for token those
of the same server without speculation, with n-gram drafts and with a draft model (SmolLM2 as
its own draft, and a copy of SmolLM2 with six of its 30 blocks removed), for one request and four at
once, streamed and not, with a stop string and with a grammar.

Each server runs once and answers every case; the tests compare the recorded answers. Prompt
plus answer stay under 256 tokens per slot: there llama.cpp's CPU attention computes a
several-token verification row exactly as it computes one token (past 256 KV cells a one-token
decode takes a split-KV kernel of its own, and results drift apart by rounding, in the C++
server as much as here).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.models.truncated import write_truncated

from .conftest import start_server, stop_server

ITEMS = "apples, pears, plums, cherries, grapes, lemons, limes, melons, peaches, figs, dates, kiwis"
PROMPT = f"Copy the list exactly, three times.\nList: {ITEMS}\nCopy 1: {ITEMS}\nCopy 2:"
PARALLEL = [
    PROMPT,
    f"Repeat after me: {ITEMS}. Again: {ITEMS}. Again:",
    "Count: one two three four five six seven eight nine ten. Count again: one two three",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
]
# Any fruit after the first two ends the answer: where the list is copied faithfully the stop
# falls mid-answer, and the kernels of one CPU or another (which tilt SmolLM2 between a faithful
# copy and "pears, pears, ...") cannot carry the answer past all of them to n_predict.
STOPS = ITEMS.split(", ")[2:]
GRAMMAR = 'root ::= (" " fruit ",")+\nfruit ::= "apples" | "pears" | "plums" | "cherries" | "grapes" | "lemons"'
BASE = {"temperature": 0, "n_predict": 32, "return_tokens": True}
CASES: dict[str, dict[str, Any]] = {
    "single": {"prompt": PROMPT},
    "streamed": {"prompt": PROMPT, "stream": True},
    "stop string": {"prompt": PROMPT, "stop": STOPS},
    "grammar": {"prompt": PROMPT, "grammar": GRAMMAR, "n_predict": 24},
}


# A static lookup cache (llama.cpp's llama-lookup-create writes these from a corpus): bigram ->
# counts of the next token. Arbitrary token ids: the test checks the file is read.
STATIC_NGRAMS = {(28, 30): {31: 3}, (95, 96): {97: 2, 98: 1}, (1, 2): {3: 5}}


def lookup_cache_bytes(ngrams: dict[tuple[int, ...], dict[int, int]]) -> bytes:
    """llama.cpp's common_ngram_cache_save layout: the n-gram as 4 int32 tokens (-1 padded), the
    int32 count of continuations, then int32 (token, count) pairs."""
    out = b""
    for gram, counts in ngrams.items():
        out += struct.pack("<4ii", *gram, *[-1] * (4 - len(gram)), len(counts))
        out += b"".join(struct.pack("<ii", t, c) for t, c in counts.items())
    return out


def read_lookup_cache(path: Path) -> dict[tuple[int, ...], dict[int, int]]:
    data, at, out = path.read_bytes(), 0, {}
    while at < len(data):
        *gram, n = struct.unpack_from("<4ii", data, at)
        at += 20
        pairs = dict(struct.unpack_from("<ii", data, at + 8 * k) for k in range(n))
        at += 8 * n
        out[tuple(t for t in gram if t != -1)] = pairs
    return out


def _complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    if not body.get("stream"):
        r = httpx.post(f"{url}/completion", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return dict(r.json())
    tokens: list[int] = []
    content = ""
    last: dict[str, Any] = {}
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
                content += last["content"]
                tokens += last.get("tokens", [])
    return {**last, "content": content, "tokens": tokens}


def _answers(url: str) -> dict[str, Any]:
    out: dict[str, Any] = {name: _complete(url, {**BASE, **body}) for name, body in CASES.items()}
    with ThreadPoolExecutor(4) as pool:
        out["4 parallel"] = list(pool.map(lambda p: _complete(url, {**BASE, "prompt": p}), PARALLEL))
    out["slots"] = httpx.get(f"{url}/slots", timeout=30).json()
    out["metrics"] = httpx.get(f"{url}/metrics", timeout=30).text
    return out


# SmolLM2's 30 blocks less six in the middle: cheaper, and it agrees with the full model on some
# tokens only (half the blocks agree on none).
DRAFT_LAYERS = [i for i in range(30) if not 10 <= i < 16]
SERVERS = {
    "plain": [],
    "ngram-simple": [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        "3",
        "--spec-ngram-simple-size-m",
        "8",
    ],
    "ngram-cache": ["--spec-type", "ngram-cache", "-lcs", "{tmp}/static.bin", "-lcd", "{tmp}/dynamic.bin"],
    # The draft's own placement flags change where it runs, not what it drafts.
    "self draft": ["--spec-type", "draft-simple", "-md", "{model}", "--spec-draft-n-max", "4"]
    + ["-otd", r"token_embd\.weight=CPU", "-devd", "none", "-tbd", "1", "--poll-draft", "0"],
    "truncated draft": ["--spec-type", "draft-simple", "-md", "{truncated}", "--spec-draft-n-max", "4"],
}


@pytest.fixture(scope="module")
def answers(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("speculative")
    truncated = str(tmp / "smollm2-half.gguf")
    write_truncated(model_path, truncated, keep_layers=DRAFT_LAYERS)
    (tmp / "static.bin").write_bytes(lookup_cache_bytes(STATIC_NGRAMS))
    out: dict[str, dict[str, Any]] = {}
    for name, extra in SERVERS.items():
        args = [a.format(model=model_path, truncated=truncated, tmp=tmp) for a in extra]
        srv = start_server(["-m", model_path, "-np", "4", "-c", "1024", "-t", "2", "--metrics", *args], tmp)
        try:
            out[name] = _answers(srv.url)
        finally:
            stop_server(srv)
        out[name]["log"] = srv.log()
    out["ngram-cache"]["dynamic"] = read_lookup_cache(tmp / "dynamic.bin")
    yield out


SPECULATIVE = [name for name in SERVERS if name != "plain"]


@pytest.mark.parametrize("server", SPECULATIVE)
@pytest.mark.parametrize("case", list(CASES))
def test_answers_are_token_for_token_the_plain_ones(answers: dict[str, Any], server: str, case: str) -> None:
    plain, fast = answers["plain"][case], answers[server][case]
    assert fast["tokens"] == plain["tokens"]
    assert fast["content"] == plain["content"]
    assert fast["stop_type"] == plain["stop_type"]
    if case == "stop string":
        assert plain["stop_type"] == "word" and plain["stopping_word"] in STOPS, plain["content"]


@pytest.mark.parametrize("server", SPECULATIVE)
def test_four_requests_at_once_get_the_plain_answers(answers: dict[str, Any], server: str) -> None:
    for plain, fast in zip(answers["plain"]["4 parallel"], answers[server]["4 parallel"]):
        assert fast["tokens"] == plain["tokens"]


@pytest.mark.parametrize("server", SPECULATIVE)
def test_drafts_are_counted_in_timings_slots_and_metrics(answers: dict[str, Any], server: str) -> None:
    timings = answers[server]["single"]["timings"]
    assert timings["draft_n"] > 0
    assert 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert "draft_n" not in answers["plain"]["single"]["timings"]  # as llama-server: only when drafting
    slot = answers[server]["slots"][0]
    assert slot["speculative"] is True
    kind = server if server.startswith("ngram") else "draft-simple"
    assert slot["params"]["speculative.types"] == kind
    assert answers["plain"]["slots"][0]["params"]["speculative.types"] == "none"
    metrics = answers[server]["metrics"]
    drafted = _metric(metrics, "llamacpp:spec_decode_num_draft_tokens_total")
    accepted = _metric(metrics, "llamacpp:spec_decode_num_accepted_tokens_total")
    assert drafted >= timings["draft_n"] and 0 < accepted <= drafted
    assert _metric(answers["plain"]["metrics"], "llamacpp:spec_decode_num_draft_tokens_total") == 0


def test_a_draft_model_with_fewer_layers_is_accepted_less_often(answers: dict[str, Any]) -> None:
    """SmolLM2 drafting for itself is always right; the cut-down copy only sometimes."""
    same = answers["self draft"]["single"]["timings"]
    cut = answers["truncated draft"]["single"]["timings"]
    assert same["draft_n_accepted"] == same["draft_n"]
    assert cut["draft_n_accepted"] < cut["draft_n"]


def test_ngram_cache_reads_the_static_cache_and_writes_what_it_learned(answers: dict[str, Any]) -> None:
    """-lcs is read at start; -lcd, absent then, holds the n-grams of the answers once the server stops."""
    log = answers["ngram-cache"]["log"]
    assert f"static.bin ({len(STATIC_NGRAMS)} n-grams), dynamic cache" in log
    learned = answers["ngram-cache"]["dynamic"]
    tokens = answers["plain"]["single"]["tokens"]
    for i in range(4, 12):
        gram = tuple(tokens[i - 4 : i])
        assert learned[gram].get(tokens[i], 0) >= 1, (gram, tokens[i])


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_unsupported_types_are_refused_at_start_with_the_reason(model_path: str, tmp_path: Path) -> None:
    for kind, reason in (("draft-eagle3", "EAGLE-3 draft head"), ("draft-mtp", "multi-token")):
        with pytest.raises(RuntimeError, match=f"(?s){reason}.*hidden states.*llama-ext.h"):
            start_server(["-m", model_path, "--spec-type", kind], tmp_path, timeout=30)
