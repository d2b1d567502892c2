"""Images and audio through mtmd: MECHANICS tests, with a projector of random weights.

No real vision or audio model is available offline, so the server runs SmolLM2-135M
beside `tests/models/mmproj.omni_projector`: a gemma3-type vision encoder and a
qwen2a-type audio encoder whose weights are seeded noise at SmolLM2's width. What the
model says about an image means nothing; what these tests check is the plumbing: media
become the number of tokens mtmd reports, they take part in the prompt cache by content,
generation is deterministic, several slots share the scheduler, bad media are 400s.
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.media_files import flac, png, video_clip, wav_tone
from tests.models.mmproj import omni_projector
from tests.server.conftest import RunningServer, start_server, stop_server

IMAGE_TOKENS = (128 // 8 // 2) ** 2  # the projector's image_size / patch_size / pooling, squared
AUDIO_TOKENS = 750  # one 30 s window of qwen2a
HTTP = httpx.Client(timeout=300)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("media")
    (root / "local.png").write_bytes(png(40, 30, seed=7))
    return root


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return omni_projector(tmp_path_factory.mktemp("mmproj") / "mmproj-omni.gguf")


@pytest.fixture(scope="module")
def mm(model_path: str, projector: Path, media_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    args = ["-m", model_path, "-mm", str(projector), "-c", "8192", "-np", "4", "--media-path", str(media_dir)]
    args += ["--video-fps", "2", "--video-timestamp-interval", "1000"]  # 2 frames a second, a timestamp each second
    server: RunningServer = start_server(args, tmp_path_factory.mktemp("mm-server"))
    try:
        yield server.url
    finally:
        stop_server(server)


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_chat(url: str, image: str, text: str = "What is in this picture?", **extra: Any) -> httpx.Response:
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": image}}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0, **extra}
    return HTTP.post(f"{url}/v1/chat/completions", json=body)


def ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_props_and_models_report_what_the_model_takes(mm: str) -> None:
    props = ok(HTTP.get(f"{mm}/props"))
    assert props["modalities"] == {"vision": True, "video": True, "audio": True}
    assert props["media_marker"].startswith("<__media_")
    models = ok(HTTP.get(f"{mm}/v1/models"))
    assert models["data"][0]["architecture"]["input_modalities"] == ["text", "image", "audio"]
    assert "multimodal" in models["models"][0]["capabilities"]


def test_an_image_is_the_tokens_mtmd_makes_of_it(mm: str, model_path: str, projector: Path) -> None:
    """prompt_n of a native completion equals what libmtmd's own tokenizer makes of the prompt."""
    from llamaserve.llama.model import Model
    from llamaserve.llama.mtmd import CHUNK_TEXT, Projector, ProjectorSettings

    marker = ok(HTTP.get(f"{mm}/props"))["media_marker"]
    image = png(70, 50, seed=11)
    prompt = f"Describe {marker} briefly."
    body = {"prompt_string": prompt, "multimodal_data": [base64.b64encode(image).decode()]}
    r = ok(HTTP.post(f"{mm}/completion", json={"prompt": body, "n_predict": 2, "cache_prompt": False}))
    model = Model(model_path)
    proj = Projector(str(projector), model, ProjectorSettings(use_gpu=False, n_threads=1, warmup=False, marker=marker))
    try:
        chunks = proj.tokenize(prompt, [image], add_special=True, parse_special=True)
        media = [c.n_tokens for c in chunks if c.kind != CHUNK_TEXT]
        assert media == [IMAGE_TOKENS]
        assert r["timings"]["prompt_n"] == sum(c.n_tokens for c in chunks)
        Projector.release(chunks)
    finally:
        proj.close()
        model.close()


def test_same_image_is_served_from_the_cache_and_a_different_one_is_not(mm: str) -> None:
    first_image, other_image = data_uri(png(64, 64, seed=1)), data_uri(png(64, 64, seed=2))
    first = ok(image_chat(mm, first_image, id_slot=0, cache_prompt=True))
    again = ok(image_chat(mm, first_image, id_slot=0, cache_prompt=True))
    n_prompt = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    assert n_prompt > IMAGE_TOKENS
    assert again["timings"]["cache_n"] >= IMAGE_TOKENS
    assert again["timings"]["cache_n"] == n_prompt - 1  # all but the last token, whose logits are needed
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    other = ok(image_chat(mm, other_image, id_slot=0, cache_prompt=True))
    # Same text around it, so only the image differs: its KV must be computed again.
    assert other["timings"]["prompt_n"] >= IMAGE_TOKENS
    assert other["timings"]["cache_n"] <= n_prompt - IMAGE_TOKENS


def test_input_tokens_counts_the_image_as_its_tokens(mm: str) -> None:
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": data_uri(png(9, 9))}},
    ]
    messages = [{"role": "user", "content": content}]
    counted = ok(HTTP.post(f"{mm}/v1/chat/completions/input_tokens", json={"messages": messages}))["input_tokens"]
    run = ok(HTTP.post(f"{mm}/v1/chat/completions", json={"messages": messages, "max_tokens": 1}))
    assert counted == run["usage"]["prompt_tokens"] and counted > IMAGE_TOKENS


def test_generation_is_deterministic_at_temperature_0(mm: str) -> None:
    image = data_uri(png(50, 80, seed=3))
    texts = {ok(image_chat(mm, image, cache_prompt=False))["choices"][0]["message"]["content"] for _ in range(2)}
    assert len(texts) == 1
    assert texts.pop()  # the random weights still produce text


def test_image_and_text_requests_run_together(mm: str) -> None:
    def image_job(seed: int) -> dict[str, Any]:
        return ok(image_chat(mm, data_uri(png(32, 32, seed=100 + seed)), max_tokens=6))

    def text_job(seed: int) -> dict[str, Any]:
        body = {"messages": [{"role": "user", "content": f"Count to {seed + 3}."}], "max_tokens": 6, "temperature": 0}
        return ok(HTTP.post(f"{mm}/v1/chat/completions", json=body))

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        images = [pool.submit(image_job, i) for i in range(4)]
        texts = [pool.submit(text_job, i) for i in range(4)]
        done = [f.result(timeout=300) for f in images + texts]
    assert all(d["choices"][0]["finish_reason"] in ("stop", "length") for d in done)
    assert all(d["timings"]["prompt_n"] + d["timings"]["cache_n"] > IMAGE_TOKENS for d in done[:4])


BAD_IMAGES = [
    ("data:image/png;base64,not*base64!", "not valid base64"),
    (data_uri(b"<html>hello</html>", "text/html"), "invalid data URI type"),
    (data_uri(b"\x89PNG but not really an image"), "could not be decoded"),
    (data_uri(b"\0" * (10 * 1024 * 1024 + 1)), "larger than"),
    ("https://example.com/cat.png", "remote media URLs are refused"),
    ("file://../secret.png", "not allowed"),
    ("file://missing.png", "does not exist"),
]


@pytest.mark.parametrize(("image", "needle"), BAD_IMAGES, ids=[n for _, n in BAD_IMAGES])
def test_bad_media_is_a_400_naming_the_part(mm: str, image: str, needle: str) -> None:
    r = image_chat(mm, image)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("messages.0.content.1: ") and needle in message


def test_bad_media_leaves_other_slots_generating(mm: str) -> None:
    body = {"prompt": "Once upon a time", "n_predict": 48, "ignore_eos": True, "stream": True}
    with HTTP.stream("POST", f"{mm}/completion", json=body) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        for image, _ in BAD_IMAGES[:3]:
            assert image_chat(mm, image).status_code == 400
        events = [line for line in lines if line.startswith("data: ")]
    assert '"stop":true' in events[-1].replace(" ", "")


def test_a_local_file_under_media_path(mm: str) -> None:
    r = ok(image_chat(mm, "file://local.png"))
    assert r["timings"]["prompt_n"] + r["timings"]["cache_n"] > IMAGE_TOKENS


def test_native_completion_marker_count_must_match(mm: str) -> None:
    body = {"prompt_string": "no marker here", "multimodal_data": [base64.b64encode(png(8, 8)).decode()]}
    r = HTTP.post(f"{mm}/completion", json={"prompt": body, "n_predict": 1})
    assert r.status_code == 400 and "media marker" in r.json()["error"]["message"]


def test_anthropic_image_block(mm: str) -> None:
    image = base64.b64encode(png(48, 48, seed=5)).decode()
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": image}},
        {"type": "text", "text": "What is this?"},
    ]
    body = {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    r = ok(HTTP.post(f"{mm}/v1/messages", json=body))
    used = r["usage"]["input_tokens"] + r["usage"].get("cache_read_input_tokens", 0)
    assert used > IMAGE_TOKENS
    counted = ok(HTTP.post(f"{mm}/v1/messages/count_tokens", json={k: body[k] for k in ("model", "messages")}))
    assert counted["input_tokens"] == used


def test_responses_input_image(mm: str) -> None:
    content = [
        {"type": "input_text", "text": "Describe it."},
        {"type": "input_image", "image_url": data_uri(png(20, 20))},
    ]
    body = {"input": [{"role": "user", "content": content}], "max_output_tokens": 4, "store": False}
    r = ok(HTTP.post(f"{mm}/v1/responses", json=body))
    assert r["usage"]["input_tokens"] > IMAGE_TOKENS


def test_input_audio_and_transcriptions(mm: str) -> None:
    wav = wav_tone(1.0)
    audio_part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    # The instruction /v1/audio/transcriptions writes, so the transcriptions below reuse this KV.
    instruction = {"type": "text", "text": "Transcribe audio to text (language: en)"}
    body = {"messages": [{"role": "user", "content": [instruction, audio_part]}], "max_tokens": 4, "temperature": 0}
    chat = ok(HTTP.post(f"{mm}/v1/chat/completions", json=body))
    assert chat["timings"]["prompt_n"] + chat["timings"]["cache_n"] > AUDIO_TOKENS
    files = {"file": ("tone.wav", wav, "audio/wav")}
    form = {"model": "whisper-1", "language": "en", "temperature": "0", "max_tokens": "4"}
    r = ok(HTTP.post(f"{mm}/v1/audio/transcriptions", files=files, data=form))
    assert r["type"] == "transcript.text.done" and isinstance(r["text"], str)
    assert r["usage"]["type"] == "tokens" and r["usage"]["input_tokens"] > AUDIO_TOKENS
    stream = HTTP.post(f"{mm}/v1/audio/transcriptions", files=files, data={**form, "stream": "true"})
    assert stream.status_code == 200
    events = [line for line in stream.text.splitlines() if line.startswith("data: ")]
    assert '"transcript.text.done"' in events[-2] and events[-1] == "data: [DONE]"
    assert r["usage"]["input_tokens_details"]["cached_tokens"] >= AUDIO_TOKENS  # the chat's audio
    # The same audio and instruction again: the audio's KV comes from the prompt cache.
    done = json.loads(events[-2][len("data: ") :])
    assert done["usage"]["input_tokens_details"]["cached_tokens"] >= AUDIO_TOKENS


def test_transcription_without_a_file_or_with_a_wrong_format(mm: str) -> None:
    r = HTTP.post(f"{mm}/v1/audio/transcriptions", files={"other": ("x.txt", b"x")}, data={"model": "m"})
    assert r.status_code == 400 and "No input file" in r.json()["error"]["message"]
    mp3 = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_tone(0.1)).decode(), "format": "mp3"}}
    body = {"messages": [{"role": "user", "content": [mp3]}], "max_tokens": 1}
    r = HTTP.post(f"{mm}/v1/chat/completions", json=body)
    assert r.status_code == 400 and "not an MP3 file" in r.json()["error"]["message"]


def test_text_only_model_refuses_media_naming_its_modalities(base_url: str) -> None:
    r = image_chat(base_url, data_uri(png(8, 8)))
    assert r.status_code == 400
    error = r.json()["error"]
    assert "image input is not supported" in error["message"] and "accepts text" in error["message"]
    assert error["modalities"] == {"vision": False, "video": False, "audio": False}
    r = HTTP.post(f"{base_url}/v1/audio/transcriptions", files={"file": ("a.wav", wav_tone(0.1), "audio/wav")})
    assert r.status_code == 501 and "does not support audio input" in r.json()["error"]["message"]


def _prompt_n(r: httpx.Response) -> int:
    timings = ok(r)["timings"]
    return int(timings["prompt_n"] + timings["cache_n"])


def test_a_video_is_its_frames_at_the_servers_fps_with_timestamps(mm: str) -> None:
    """--video-fps 2 over a 2 s clip: 4 frames, each IMAGE_TOKENS like an image, after mtmd's
    "Video:", and --video-timestamp-interval 1000: "[0m0.00s]" after the first frame and
    "[0m1.00s]" after the third (llama-server's helper writes the same text)."""
    clip = video_clip(seconds=2.0, size=(32, 32))
    video = {"type": "input_video", "input_video": {"url": data_uri(clip, "video/mp4")}}
    frames = [{"type": "image_url", "image_url": {"url": data_uri(png(16, 16, seed=i))}} for i in range(4)]
    question = {"type": "text", "text": "What happens?"}

    def prompt_n(content: list[dict[str, Any]]) -> int:
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "cache_prompt": False}
        return _prompt_n(HTTP.post(f"{mm}/v1/chat/completions", json=body))

    stamps = sum(
        len(ok(HTTP.post(f"{mm}/tokenize", json={"content": t, "add_special": False}))["tokens"])
        for t in ("Video:", "[0m0.00s]", "[0m1.00s]")
    )
    assert prompt_n([video, question]) == prompt_n([*frames, question]) + stamps
    # OpenAI's spelling, {"video_url": {"url": ...}}, is the same video.
    alias = {"type": "video_url", "video_url": {"url": data_uri(clip, "video/mp4")}}
    assert prompt_n([alias, question]) == prompt_n([video, question])


def test_a_video_that_is_not_one_is_a_400(mm: str) -> None:
    video = {"type": "input_video", "input_video": {"url": data_uri(b"not a video at all", "video/mp4")}}
    body = {"messages": [{"role": "user", "content": [video, {"type": "text", "text": "?"}]}], "max_tokens": 1}
    r = HTTP.post(f"{mm}/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("messages.0.content.0: ")


def test_flac_audio_is_the_same_audio_as_wav(mm: str) -> None:
    wav = wav_tone(1.0, freq=330.0)

    def prompt_n(data: bytes, fmt: str) -> int:
        part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}
        content = [{"type": "text", "text": "Hear:"}, part, {"type": "text", "text": "?"}]
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "cache_prompt": False}
        return _prompt_n(HTTP.post(f"{mm}/v1/chat/completions", json=body))

    assert prompt_n(flac(wav), "flac") == prompt_n(wav, "wav") > AUDIO_TOKENS
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "flac"}}
    r = HTTP.post(f"{mm}/v1/chat/completions", json={"messages": [{"role": "user", "content": [part]}]})
    assert r.status_code == 400 and "not a FLAC file" in r.json()["error"]["message"]
