"""Qwen2-VL-family projectors (M-RoPE): positions, against the C++ llama-server.

A tiny random-weight ``qwen2vl`` text model and ``qwen2vl_merger`` projector
(`tests/models/qwen2vl.py`) stand in for Qwen2-VL. What sets the family apart is where an
image sits: each of its embeddings at (time, row, column) positions, and the text after it
moved on by the larger side of the image's grid, not by its token count. The answers of a
random model mean nothing, but its log-probabilities depend on every position: so the same
temperature-0 requests to our server and to the C++ llama-server built from the same
llama.cpp must give the same tokens and log-probabilities, on a first turn, on a follow-up
that reuses the first turn's KV, and as embeddings.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.media_files import png, video_clip
from tests.models.qwen2vl import projector, text_model

from .conftest import REPO, RunningServer, start_server, stop_server

CPP_SERVER = REPO / "benchmarks" / ".cpp-server" / "llama-server"
# Both sides: the same kernels and batch shapes (as test_cpp_parity.py), no projector warm-up
# (Qwen-VL's warms up on a 46 x 46 grid), images capped at 64 tokens.
COMMON = ["-c", "4096", "-np", "1", "-t", "2", "-fa", "off", "--no-repack", "--no-warmup", "--image-max-tokens", "64"]
GREEDY = {"temperature": 0.0, "seed": 1, "logprobs": True, "top_logprobs": 3}
HTTP = httpx.Client(timeout=300)
IMAGE = png(64, 48, seed=11)  # a 4 x 3 grid of merged 16-pixel patches: 12 tokens, 4 positions


@pytest.fixture(scope="module")
def qwen_files(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("qwen2vl")
    return str(text_model(root / "qwen2vl.gguf", model_path)), str(projector(root / "mmproj-qwen2vl.gguf"))


def _pair(args: list[str], tmp: Path) -> Iterator[tuple[str, str]]:
    assert CPP_SERVER.exists(), f"{CPP_SERVER} is missing: benchmarks/build_cpp_server.sh builds it"
    ours = start_server(args, tmp)
    cpp: RunningServer | None = None
    try:
        cpp = start_server(args, tmp, program=[str(CPP_SERVER)])
        yield ours.url, cpp.url
    finally:
        stop_server(ours)
        if cpp is not None:
            stop_server(cpp)


@pytest.fixture(scope="module")
def servers(qwen_files: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    text, mmproj = qwen_files
    yield from _pair(["-m", text, "-mm", mmproj, *COMMON], tmp_path_factory.mktemp("qwen-chat"))


def image_uri(data: bytes = IMAGE) -> str:
    return f"data:image/png;base64,{base64.b64encode(data).decode()}"


def chat(url: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    r = HTTP.post(f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 8, **GREEDY, **extra})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def first_turn() -> list[dict[str, Any]]:
    content = [
        {"type": "text", "text": "Look:"},
        {"type": "image_url", "image_url": {"url": image_uri()}},
        {"type": "text", "text": "What is in it?"},
    ]
    return [{"role": "user", "content": content}]


def tokens_and_logprobs(body: dict[str, Any]) -> list[tuple[str, float, list[tuple[str, float]]]]:
    return [
        (t["token"], t["logprob"], [(a["token"], a["logprob"]) for a in t["top_logprobs"]])
        for t in body["choices"][0]["logprobs"]["content"]
    ]


def same_answer(ours: dict[str, Any], cpp: dict[str, Any]) -> None:
    a, b = tokens_and_logprobs(ours), tokens_and_logprobs(cpp)
    assert [t for t, _, _ in a] == [t for t, _, _ in b]
    for (_, lp_a, top_a), (_, lp_b, top_b) in zip(a, b):
        assert lp_a == pytest.approx(lp_b, abs=1e-3)
        assert [t for t, _ in top_a] == [t for t, _ in top_b]


def test_props_say_vision_and_video(servers: tuple[str, str]) -> None:
    ours = HTTP.get(f"{servers[0]}/props").json()
    cpp = HTTP.get(f"{servers[1]}/props").json()
    assert ours["modalities"] == cpp["modalities"] == {"vision": True, "video": True, "audio": False}


def test_an_image_answers_as_the_cpp_server_does(servers: tuple[str, str]) -> None:
    ours, cpp = (chat(url, first_turn()) for url in servers)
    # 12 image tokens, but 4 positions: a wrong position anywhere after the image changes the logits.
    assert ours["usage"]["prompt_tokens"] == cpp["usage"]["prompt_tokens"]
    same_answer(ours, cpp)
    text_only = chat(servers[0], [{"role": "user", "content": "Look:What is in it?"}])
    assert ours["usage"]["prompt_tokens"] > text_only["usage"]["prompt_tokens"] + 12


def test_a_follow_up_reuses_the_image_turn_and_still_agrees(servers: tuple[str, str]) -> None:
    firsts = [chat(url, first_turn()) for url in servers]
    reply = firsts[0]["choices"][0]["message"]["content"]
    follow = [*first_turn(), {"role": "assistant", "content": reply}, {"role": "user", "content": "And the colours?"}]
    ours, cpp = (chat(url, follow) for url in servers)
    # The first turn's KV (image included) is reused; the text after it is placed where it was.
    assert ours["timings"]["cache_n"] >= firsts[0]["usage"]["prompt_tokens"] - 1
    assert ours["usage"]["prompt_tokens_details"]["cached_tokens"] == ours["timings"]["cache_n"]
    same_answer(ours, cpp)
    fresh = chat(servers[0], follow, cache_prompt=False)
    assert fresh["timings"]["cache_n"] == 0
    same_answer(ours, fresh)


def test_two_images_place_the_second_after_the_first_positions(servers: tuple[str, str]) -> None:
    content = [
        {"type": "image_url", "image_url": {"url": image_uri()}},
        {"type": "text", "text": "and"},
        {"type": "image_url", "image_url": {"url": image_uri(png(48, 80, seed=12))}},
        {"type": "text", "text": "differ how?"},
    ]
    ours, cpp = (chat(url, [{"role": "user", "content": content}]) for url in servers)
    assert ours["usage"]["prompt_tokens"] == cpp["usage"]["prompt_tokens"]
    same_answer(ours, cpp)


def test_a_video_answers_as_the_cpp_server_does(servers: tuple[str, str]) -> None:
    """Frames sampled by ffmpeg at 4 per second (Qwen-VL merges each pair into one image),
    text timestamps between them: the same prompt, positions and answer on both."""
    clip = base64.b64encode(video_clip(seconds=1.0, size=(64, 48))).decode()
    content = [
        {"type": "input_video", "input_video": {"url": f"data:video/mp4;base64,{clip}"}},
        {"type": "text", "text": "What happens?"},
    ]
    ours, cpp = (chat(url, [{"role": "user", "content": content}]) for url in servers)
    assert ours["usage"]["prompt_tokens"] == cpp["usage"]["prompt_tokens"] > 2 * 12
    same_answer(ours, cpp)


@pytest.fixture(scope="module")
def embedders(qwen_files: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    text, mmproj = qwen_files
    args = ["-m", text, "-mm", mmproj, *COMMON, "--embeddings", "--pooling", "last"]
    yield from _pair(args, tmp_path_factory.mktemp("qwen-embd"))


def embed(url: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    r = HTTP.post(f"{url}/v1/embeddings", json={"input": [{"content": content}]})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_embeddings_of_an_image_match_the_cpp_server(embedders: tuple[str, str]) -> None:
    content = [
        {"type": "text", "text": "a picture: "},
        {"type": "image_url", "image_url": {"url": image_uri()}},
        {"type": "text", "text": " described"},
    ]
    ours, cpp = (embed(url, content) for url in embedders)
    assert ours["usage"]["prompt_tokens"] == cpp["usage"]["prompt_tokens"]
    a, b = ours["data"][0]["embedding"], cpp["data"][0]["embedding"]
    assert len(a) == len(b) == 64
    assert a == pytest.approx(b, abs=1e-4)
    # Another image, another vector; the text alone has fewer tokens.
    other = embed(
        embedders[0], [content[0], {**content[1], "image_url": {"url": image_uri(png(64, 48, seed=5))}}, content[2]]
    )
    assert other["data"][0]["embedding"] != pytest.approx(a, abs=1e-4)
    text_only = embed(embedders[0], [content[0], content[2]])
    assert text_only["usage"]["prompt_tokens"] + 12 < ours["usage"]["prompt_tokens"]
