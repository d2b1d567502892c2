"""Embeddings and reranking on a converted all-MiniLM-L6-v2; infill on Qwen2.5-Coder."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from tests.models.bert import cached_models, locate_minilm
from tests.models.packaged import qwen_coder

from .conftest import RunningServer, start_server, stop_server

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.",
    "The cat sits on the mat.",
    "Stock markets fell sharply on Monday.",
    "The recipe needs two cups of flour.",
    "Quantum computers use qubits.",
    "The train to Paris leaves at noon.",
    "Il pleut beaucoup à Brest.",
    "東京は日本の首都です。",
    "She plays tennis every weekend.",
    "Photosynthesis happens in chloroplasts.",
    "The server returned a 404 error.",
    "My phone battery died.",
    "Dogs are loyal companions.",
    "He painted the fence white.",
]


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    embed_gguf, _ = cached_models()
    srv = start_server(
        ["-m", str(embed_gguf), "--embedding", "-np", "4", "-c", "2048", "-ub", "128", "-b", "512"],
        tmp_path_factory.mktemp("embed"),
    )
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    _, rerank_gguf = cached_models()
    srv = start_server(
        ["-m", str(rerank_gguf), "--reranking", "-np", "4", "-c", "2048"], tmp_path_factory.mktemp("rerank")
    )
    yield srv
    stop_server(srv)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_embeddings_match_sentence_transformers(embed_server: RunningServer) -> None:
    import sentence_transformers as st

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    reference = st.SentenceTransformer(str(locate_minilm()), device="cpu").encode(SENTENCES)
    client = openai.OpenAI(base_url=f"{embed_server.url}/v1", api_key="none", max_retries=0)
    ours = [
        np.array(d.embedding)
        for d in client.embeddings.create(model="m", input=SENTENCES, encoding_format="float").data
    ]
    sims = [cosine(a, b) for a, b in zip(ours, reference)]
    assert len(sims) == len(SENTENCES) >= 20
    assert min(sims) > 0.99, sims


def test_similar_sentences_score_above_unrelated_ones(embed_server: RunningServer) -> None:
    r = httpx.post(f"{embed_server.url}/v1/embeddings", json={"input": SENTENCES}, timeout=60).json()
    vec = {SENTENCES[d["index"]]: np.array(d["embedding"]) for d in r["data"]}
    pairs_similar = [(0, 1), (3, 6), (7, 8)]
    pairs_unrelated = [(0, 12), (3, 10), (7, 18)]
    for (a, b), (c, d) in zip(pairs_similar, pairs_unrelated):
        assert cosine(vec[SENTENCES[a]], vec[SENTENCES[b]]) > cosine(vec[SENTENCES[c]], vec[SENTENCES[d]]) + 0.2
    assert all(abs(np.linalg.norm(v) - 1.0) < 1e-4 for v in vec.values())  # OpenAI vectors are unit length
    assert r["usage"]["prompt_tokens"] > len(SENTENCES)


def test_sdk_default_base64_equals_float(embed_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=f"{embed_server.url}/v1", api_key="none", max_retries=0)
    default = client.embeddings.create(model="m", input=SENTENCES[:5])  # the SDK asks for base64
    floats = client.embeddings.create(model="m", input=SENTENCES[:5], encoding_format="float")
    for a, b in zip(default.data, floats.data):
        assert np.allclose(np.array(a.embedding), np.array(b.embedding), atol=1e-6)
    raw = httpx.post(f"{embed_server.url}/v1/embeddings", json={"input": "hi", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert decoded.shape == (384,)


def test_token_inputs_and_many_inputs_in_order(embed_server: RunningServer) -> None:
    url = embed_server.url
    tokens = httpx.post(f"{url}/tokenize", json={"content": "A cat.", "add_special": True}).json()["tokens"]
    by_text = httpx.post(f"{url}/v1/embeddings", json={"input": "A cat."}).json()["data"][0]["embedding"]
    by_ids = httpx.post(f"{url}/v1/embeddings", json={"input": tokens}).json()["data"][0]["embedding"]
    assert np.allclose(by_text, by_ids, atol=1e-4)
    many = httpx.post(f"{url}/v1/embeddings", json={"input": [tokens, tokens]}).json()["data"]
    assert len(many) == 2
    forty = [f"sentence number {i}" for i in range(40)]
    r = httpx.post(f"{url}/v1/embeddings", json={"input": forty}, timeout=60).json()["data"]
    assert [d["index"] for d in r] == list(range(40))
    alone = httpx.post(f"{url}/v1/embeddings", json={"input": forty[17]}).json()["data"][0]["embedding"]
    assert cosine(np.array(alone), np.array(r[17]["embedding"])) > 0.9999


def test_input_longer_than_the_micro_batch_is_a_400(embed_server: RunningServer) -> None:
    r = httpx.post(f"{embed_server.url}/v1/embeddings", json={"input": "word " * 300})
    assert r.status_code == 400 and "too large" in r.json()["error"]["message"]
    assert httpx.get(f"{embed_server.url}/health").status_code == 200


def test_native_embedding_and_generation_refused(embed_server: RunningServer) -> None:
    url = embed_server.url
    r = httpx.post(f"{url}/embedding", json={"content": "hello there", "embd_normalize": -1}).json()
    assert len(r) == 1 and len(r[0]["embedding"]) == 1 and len(r[0]["embedding"][0]) == 384
    c = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert c.status_code == 501


def test_pooling_none_gives_one_vector_per_token(tmp_path_factory: pytest.TempPathFactory) -> None:
    embed_gguf, _ = cached_models()
    srv = start_server(
        ["-m", str(embed_gguf), "--embedding", "--pooling", "none", "-np", "2", "-c", "1024"],
        tmp_path_factory.mktemp("pool-none"),
    )
    try:
        n = len(
            httpx.post(f"{srv.url}/tokenize", json={"content": "hello world", "add_special": True}).json()["tokens"]
        )
        r = httpx.post(f"{srv.url}/embedding", json={"content": "hello world"}).json()
        assert len(r[0]["embedding"]) == n
        assert httpx.post(f"{srv.url}/v1/embeddings", json={"input": "x"}).status_code == 400
    finally:
        stop_server(srv)


def test_rerank_mechanics(rerank_server: RunningServer) -> None:
    """No reranker model is packaged: the head is random, so only the mechanics are checked."""
    url = rerank_server.url
    docs = ["Paris is the capital of France.", "Bananas are yellow.", "The Eiffel tower is in Paris.", "x"]
    body = {"query": "What is the capital of France?", "documents": docs}
    first = httpx.post(f"{url}/v1/rerank", json=body).json()
    second = httpx.post(f"{url}/rerank", json=body).json()
    assert first["results"] == second["results"]  # deterministic
    scores = [r["relevance_score"] for r in first["results"]]
    assert scores == sorted(scores, reverse=True) and len(scores) == 4
    assert sorted(r["index"] for r in first["results"]) == [0, 1, 2, 3]
    assert first["object"] == "list" and first["usage"]["prompt_tokens"] > 0
    top = httpx.post(f"{url}/v1/reranking", json={**body, "top_n": 2, "return_text": True}).json()["results"]
    assert len(top) == 2 and top[0]["document"]["text"] == docs[top[0]["index"]]
    tei = httpx.post(f"{url}/reranking", json={"query": body["query"], "texts": docs, "return_text": True}).json()
    assert isinstance(tei, list) and {"index", "score", "text"} <= set(tei[0])
    assert httpx.post(f"{url}/v1/rerank", json={"query": "q", "documents": []}).status_code == 400


def test_rerank_is_refused_without_the_flag(base_url: str) -> None:
    r = httpx.post(f"{base_url}/v1/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 501


def test_infill_needs_fim_tokens(base_url: str) -> None:
    r = httpx.post(f"{base_url}/infill", json={"input_prefix": "def f():", "input_suffix": "\n"})
    assert r.status_code == 400 and "fill-in-the-middle" in r.json()["error"]["message"]


def test_infill_with_a_coder_model(tmp_path_factory: pytest.TempPathFactory) -> None:
    srv = start_server(["-m", str(qwen_coder()), "-np", "1", "-c", "2048", "-t", "2"], tmp_path_factory.mktemp("coder"))
    try:
        r = httpx.post(
            f"{srv.url}/infill",
            timeout=120,
            json={
                "input_prefix": "def add(a, b):\n    return ",
                "input_suffix": "\n\nprint(add(2, 3))\n",
                "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
                "n_predict": 8,
                "temperature": 0,
            },
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert "a + b" in body["content"] or "b + a" in body["content"], body["content"]

        # token level: repository context first, then FIM_PRE prefix FIM_SUF suffix FIM_MID
        def ids(text: str) -> list[int]:
            return httpx.post(f"{srv.url}/tokenize", json={"content": text, "parse_special": True}).json()["tokens"]

        tokens = ids(body["prompt"])
        rep, sep, pre, suf, mid = (
            ids(t)[0] for t in ("<|repo_name|>", "<|file_sep|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
        )
        order = [tokens.index(t) for t in (rep, sep, pre, suf, mid)]
        assert order == sorted(order) and tokens[-1] == mid
        prefix_ids = ids("def add(a, b):\n    return ")
        assert tokens[order[2] + 1 : order[3]] == prefix_ids
        assert "util.py" in body["prompt"]
    finally:
        stop_server(srv)
