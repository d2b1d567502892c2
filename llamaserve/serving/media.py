"""Images, audio and video in requests: found in the messages, loaded, and tokenized with the prompt.

Sources, as llama-server takes them (server-common.cpp's ``handle_media``): a ``data:``
URI (image/, audio/ or video/ with base64), raw base64, ``file://`` under
``--media-path`` only, and ``http(s)://``. Unlike llama-server, remote URLs are
refused unless the operator allows them (``LLAMASERVE_REMOTE_MEDIA=1``): fetching any
URL a client names turns the server into a proxy into its own network. When allowed, a
fetch has a size cap, a timeout and follows at most a few redirects, each to http(s), and
every hop's host must resolve to public addresses only (``llamaserve/outbound.py``):
loopback and private ones only with ``LLAMASERVE_REMOTE_MEDIA=private``, link-local and
cloud metadata addresses never.

A video (``input_video``, or OpenAI's ``video_url``) is one media item like an image: the
projector's library samples its frames with ffmpeg (``--video-fps``) and puts text timestamps
between them (``--video-timestamp-interval``), as llama-server does.

Every failure is a 400 naming the content part (``messages.0.content.1: ...``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urljoin, urlparse

from llamaserve.engine.backend import MediaError
from llamaserve.errors import APIError
from llamaserve.outbound import (
    MEDIA_PUBLIC_ONLY,
    MEDIA_WITH_PRIVATE,
    AddressRefused,
    Reach,
    pinned_request_args,
    resolve_allowed,
)
from llamaserve.serving.runtime import ModelRuntime

if TYPE_CHECKING:  # httpx loads only when a remote media URL is fetched (start-up time)
    import httpx

MAX_MEDIA_BYTES = 10 * 1024 * 1024  # llama-server's download cap, here for every source
FETCH_TIMEOUT = 10.0  # seconds, as llama-server
MAX_REDIRECTS = 3
AUDIO_FORMATS = ("wav", "mp3", "flac")  # input_audio.format, checked against the data's own header
MODALITY = {"image": "vision", "audio": "audio", "video": "video"}


@dataclass(frozen=True)
class MediaRef:
    where: str  # the part's place in the request, for error messages
    kind: str  # "image" | "audio" | "video" | "media" (a prompt object's item: known once decoded)
    url: str  # a data URI, raw base64, file:// or http(s)://
    audio_format: str | None = None


def _part_ref(part: dict[str, Any], where: str) -> MediaRef | None:
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str) or not url:
            raise APIError(f"{where}: image_url needs a 'url' string")
        return MediaRef(where, "image", url)
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict):
            raise APIError(f"{where}: input_audio needs an object with 'data' and 'format'")
        data = audio.get("data", audio.get("url"))
        if not isinstance(data, str) or not data:
            raise APIError(f"{where}: input_audio needs a base64 'data' string")
        fmt = audio.get("format")
        if fmt is not None and fmt not in AUDIO_FORMATS:
            raise APIError(f"{where}: input_audio format '{fmt}' is not supported (wav, mp3 or flac)")
        return MediaRef(where, "audio", data, fmt)
    if kind in ("input_video", "video_url"):
        # llama-server reads {"data": ...} or {"url": ...} under either key.
        video = part.get(kind)
        url = video.get("data", video.get("url")) if isinstance(video, dict) else video
        if not isinstance(url, str) or not url:
            raise APIError(f"{where}: {kind} needs a 'url' or 'data' string")
        return MediaRef(where, "video", url)
    return None


def content_media(content: list[Any], where: str) -> list[MediaRef]:
    """The media parts of one content array (``where``: its place in the request)."""
    refs: list[MediaRef] = []
    for j, part in enumerate(content):
        if isinstance(part, dict):
            ref = _part_ref(part, f"{where}.{j}")
            if ref is not None:
                refs.append(ref)
    return refs


def chat_media(messages: list[Any]) -> list[MediaRef]:
    """The media parts of chat messages, in prompt order."""
    refs: list[MediaRef] = []
    for i, message in enumerate(messages):
        content = message.content if hasattr(message, "content") else message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict):
                ref = _part_ref(part, f"messages.{i}.content.{j}")
                if ref is not None:
                    refs.append(ref)
    return refs


def require_modalities(rt: ModelRuntime, refs: list[MediaRef]) -> None:
    """A 400 naming what the model accepts when a part is of a kind it does not take."""
    have = rt.modalities
    for ref in refs:
        if ref.kind in MODALITY and not have[MODALITY[ref.kind]]:
            accepted = ", ".join(["text"] + [k for k, on in have.items() if on])
            hint = " (start the server with --mmproj to add a projector)" if rt.media is None else ""
            raise APIError(
                f"{ref.where}: {ref.kind} input is not supported: this model accepts {accepted}{hint}",
                extra={"modalities": have},
            )


def _decode_base64(text: str, where: str) -> bytes:
    try:
        data = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise APIError(f"{where}: the media is not valid base64") from None
    if not data:
        raise APIError(f"{where}: the media is empty")
    return data


def _data_uri(url: str, where: str) -> bytes:
    head, sep, body = url.partition(",")
    if not sep:
        raise APIError(f"{where}: invalid data URI (no ',')")
    if not head.startswith(("data:image/", "data:audio/", "data:video/")):
        raise APIError(f"{where}: invalid data URI type '{head[5:] or '?'}' (image/*, audio/*, video/* expected)")
    if not head.endswith(";base64"):
        raise APIError(f"{where}: the data URI must be base64 encoded")
    return _decode_base64(body, where)


def _local_file(url: str, media_path: str | None, where: str) -> bytes:
    if media_path is None:
        raise APIError(f"{where}: file:// URLs are not allowed unless the server runs with --media-path")
    rel = unquote(url[len("file://") :])
    root = os.path.realpath(media_path)
    path = os.path.realpath(os.path.join(root, rel))
    if rel.startswith("/") or ".." in rel.split("/") or os.path.commonpath([root, path]) != root:
        raise APIError(f"{where}: file path is not allowed: {rel}")
    try:
        if os.path.getsize(path) > MAX_MEDIA_BYTES:
            raise APIError(f"{where}: the file is larger than {MAX_MEDIA_BYTES} bytes")
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        raise APIError(f"{where}: file does not exist or cannot be opened: {rel}") from None


async def _fetch(url: str, where: str, reach: Reach = MEDIA_PUBLIC_ONLY) -> bytes:
    import httpx  # deferred: only a server fetching remote media needs an HTTP client

    async with httpx.AsyncClient(timeout=FETCH_TIMEOUT, follow_redirects=False, trust_env=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            if urlparse(url).scheme not in ("http", "https"):
                raise APIError(f"{where}: the media URL redirects to a scheme other than http(s)")
            try:
                address = await resolve_allowed(url, reach)
            except AddressRefused as exc:
                raise APIError(f"{where}: the media URL is refused: {exc}") from None
            target, headers, extensions = pinned_request_args(url, address)
            try:
                request = client.build_request("GET", target, headers=headers, extensions=extensions)
                res = await client.send(request, stream=True)
                try:
                    if res.is_redirect and "location" in res.headers:
                        url = urljoin(url, res.headers["location"])
                        continue
                    return await _read_body(res, where)
                finally:
                    await res.aclose()
            except httpx.HTTPError as exc:
                raise APIError(f"{where}: failed to download the media ({type(exc).__name__})") from None
    raise APIError(f"{where}: too many redirects fetching the media")


async def _read_body(res: httpx.Response, where: str) -> bytes:
    if not 200 <= res.status_code < 300:
        raise APIError(f"{where}: failed to download the media (HTTP {res.status_code})")
    body = bytearray()
    async for piece in res.aiter_bytes():
        body += piece
        if len(body) > MAX_MEDIA_BYTES:
            raise APIError(f"{where}: the media is larger than {MAX_MEDIA_BYTES} bytes")
    return bytes(body)


def _check_audio_format(data: bytes, ref: MediaRef) -> None:
    if ref.audio_format == "wav" and not (data[:4] == b"RIFF" and data[8:12] == b"WAVE"):
        raise APIError(f"{ref.where}: input_audio says format 'wav' but the data is not a WAV file")
    if ref.audio_format == "mp3" and not (
        data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] >= 0xE0)
    ):
        raise APIError(f"{ref.where}: input_audio says format 'mp3' but the data is not an MP3 file")
    if ref.audio_format == "flac" and data[:4] != b"fLaC":
        raise APIError(f"{ref.where}: input_audio says format 'flac' but the data is not a FLAC file")


async def load(rt: ModelRuntime, ref: MediaRef) -> bytes:
    url = ref.url
    if url.startswith("data:"):
        data = _data_uri(url, ref.where)
    elif url.startswith(("http://", "https://")):
        if not rt.config.remote_media:
            raise APIError(
                f"{ref.where}: remote media URLs are refused by this server; send the media as a "
                "base64 data URI (the operator may allow fetching with LLAMASERVE_REMOTE_MEDIA=1)"
            )
        reach = MEDIA_WITH_PRIVATE if rt.config.remote_media_private else MEDIA_PUBLIC_ONLY
        data = await _fetch(url, ref.where, reach)
    elif url.startswith("file://"):
        data = await asyncio.to_thread(_local_file, url, rt.config.media_path, ref.where)
    else:
        data = _decode_base64(url, ref.where)
    if len(data) > MAX_MEDIA_BYTES:
        raise APIError(f"{ref.where}: the media is larger than {MAX_MEDIA_BYTES} bytes")
    if ref.kind == "audio":
        _check_audio_format(data, ref)
    return data


async def load_all(rt: ModelRuntime, refs: list[MediaRef]) -> list[bytes]:
    require_modalities(rt, refs)
    return [await load(rt, ref) for ref in refs]


async def tokenize(
    rt: ModelRuntime, prompt: str, blobs: list[bytes], refs: list[MediaRef], *, add_special: bool
) -> list[int]:
    """The prompt's tokens with each media marker replaced by that media's placeholders."""
    assert rt.media is not None
    try:
        tokens = await asyncio.to_thread(rt.media.tokenize, prompt, blobs, add_special=add_special)
    except MediaError as exc:
        raise APIError(_name_part(str(exc), refs)) from None
    if tokens and tokens[-1] < 0:
        raise APIError("the prompt cannot end with an image or audio: add text after it")
    return tokens


def _name_part(message: str, refs: list[MediaRef]) -> str:
    # The tokenizer counts media from 0 in prompt order, as the refs are.
    for i, ref in enumerate(refs):
        tag = f"media {i} "
        if message.startswith(tag):
            kind = "" if ref.kind == "media" else f"{ref.kind} "
            return f"{ref.where}: {kind}{message[len(tag) :]}"
    return message


async def prompt_object_tokens(rt: ModelRuntime, prompt: dict[str, Any]) -> list[int]:
    """llama-server's {"prompt_string": "... <marker> ...", "multimodal_data": [base64, ...]}."""
    text = prompt.get("prompt_string")
    data = prompt.get("multimodal_data")
    if not isinstance(text, str):
        raise APIError("prompt.prompt_string must be a string when multimodal_data is given")
    if not isinstance(data, list) or not all(isinstance(d, str) for d in data):
        raise APIError("prompt.multimodal_data must be a list of base64 strings")
    # The kind of each item is known only once decoded: the projector refuses one it cannot take.
    refs = [MediaRef(f"prompt.multimodal_data.{i}", "media", d) for i, d in enumerate(data)]
    blobs = [await load(rt, ref) for ref in refs]
    return await tokenize(rt, text, blobs, refs, add_special=True)
