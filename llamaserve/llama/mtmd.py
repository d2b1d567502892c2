"""llama.cpp's mtmd library (multimodal projectors) through llama-cpp-python's ctypes bindings.

`Projector` owns one ``mtmd_context``: it says what the projector takes (vision,
audio), decodes media files into bitmaps (``mtmd_helper_bitmap_init_from_buf``:
stb_image for jpeg/png/bmp/gif, miniaudio for wav/mp3/flac, the bitmap's id the
SHA-256 of the file), splits a prompt with media markers into text and media
chunks (``mtmd_tokenize``) and runs the encoder on one media chunk
(``mtmd_encode_chunk``), copying its embeddings out. Decoding those embeddings
into the text model's KV is the runner's job (`llama/runner.py`), so the
scheduler owns every ``llama_decode``.

One lock serialises tokenize and encode: both use the context's preprocessing
state and compute buffers, and callers come from several worker threads.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

import llama_cpp.mtmd_cpp as M
import numpy as np

from llamaserve.engine.backend import MediaError
from llamaserve.llama.context import FLASH_ATTN_TYPES
from llamaserve.llama.model import Model

CHUNK_TEXT = M.MTMD_INPUT_CHUNK_TYPE_TEXT


class ProjectorLoadError(RuntimeError):
    """The mmproj file could not be loaded beside the text model."""


@dataclass
class Chunk:
    """One piece of a tokenized multimodal prompt."""

    kind: int  # CHUNK_TEXT, or mtmd's image / audio chunk type
    tokens: list[int]  # text chunks: the tokens
    n_tokens: int
    media_id: str = ""  # media chunks: the bitmap id (SHA-256 of the file)
    embeddings: np.ndarray | None = None  # media chunks: (n_tokens, n_embd) float32, once encoded
    non_causal: bool = False  # decode the chunk's embeddings with full attention among them
    native: int = 0  # media chunks: mtmd's copy of the chunk, until encoded and released


@dataclass(frozen=True)
class ProjectorSettings:
    use_gpu: bool = True
    n_threads: int = 4
    flash_attn: str = "auto"
    image_min_tokens: int = -1  # -1: the projector's own
    image_max_tokens: int = -1
    warmup: bool = True
    marker: str = ""  # "": mtmd's default marker


class Projector:
    def __init__(self, path: str, model: Model, settings: ProjectorSettings) -> None:
        params = M.mtmd_context_params_default()
        params.use_gpu = settings.use_gpu
        params.print_timings = False
        params.n_threads = settings.n_threads
        params.flash_attn_type = FLASH_ATTN_TYPES[settings.flash_attn]
        params.warmup = settings.warmup
        params.image_min_tokens = settings.image_min_tokens
        params.image_max_tokens = settings.image_max_tokens
        self._marker_bytes = settings.marker.encode() if settings.marker else bytes(M.mtmd_default_marker())
        params.media_marker = self._marker_bytes
        handle = M.mtmd_init_from_file(path.encode(), model.handle, params)
        if not handle:
            raise ProjectorLoadError(f"failed to load the multimodal projector '{path}' (see the log above)")
        self.handle = handle
        self.path = path
        self._lock = threading.Lock()
        self.vision: bool = bool(M.mtmd_support_vision(handle))
        self.audio: bool = bool(M.mtmd_support_audio(handle))
        self.sample_rate: int = int(M.mtmd_get_audio_sample_rate(handle)) if self.audio else -1
        self.marker: str = self._marker_bytes.decode()
        self.mrope: bool = bool(M.mtmd_decode_use_mrope(handle))
        self.n_embd: int = model.info().n_embd

    # ---------------------------------------------------------------- media
    def _bitmap(self, data: bytes, index: int) -> int:
        if not data:
            raise MediaError(f"media {index} is empty")
        buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
        bitmap = M.mtmd_helper_bitmap_init_from_buf(self.handle, buf, len(data), False)
        if not bitmap:
            raise MediaError(
                f"media {index} could not be decoded: not an image or audio file this model takes "
                f"(images: jpeg, png, bmp, gif{'; audio: wav, mp3, flac' if self.audio else ''})"
            )
        is_audio = bool(M.mtmd_bitmap_is_audio(bitmap))
        if (is_audio and not self.audio) or (not is_audio and not self.vision):
            M.mtmd_bitmap_free(bitmap)
            kind = "audio" if is_audio else "image"
            raise MediaError(f"media {index} is {kind}, which this model does not accept")
        return int(bitmap)

    def tokenize(self, text: str, media: list[bytes], *, add_special: bool, parse_special: bool) -> list[Chunk]:
        """Split ``text`` at its markers into text chunks and one media chunk per marker."""
        found = text.count(self.marker)
        if found != len(media):
            raise MediaError(f"the prompt has {found} media marker(s) for {len(media)} media item(s); they must match")
        bitmaps: list[int] = []
        chunks_p = None
        try:
            for i, data in enumerate(media):
                bitmaps.append(self._bitmap(data, i))
            raw = text.encode("utf-8")
            inp = M.mtmd_input_text()
            inp.text = raw
            inp.text_len = len(raw)
            inp.add_special = add_special
            inp.parse_special = parse_special
            arr = (ctypes.c_void_p * max(1, len(bitmaps)))(*bitmaps)
            chunks_p = M.mtmd_input_chunks_init()
            with self._lock:
                code = int(M.mtmd_tokenize(self.handle, chunks_p, ctypes.byref(inp), arr, len(bitmaps)))
            if code != 0:
                raise MediaError(f"the media could not be preprocessed (mtmd_tokenize returned {code})")
            return self._chunks(chunks_p)
        finally:
            if chunks_p:
                M.mtmd_input_chunks_free(chunks_p)
            for b in bitmaps:
                M.mtmd_bitmap_free(b)

    def _chunks(self, chunks_p: int) -> list[Chunk]:
        out: list[Chunk] = []
        for i in range(int(M.mtmd_input_chunks_size(chunks_p))):
            chunk = M.mtmd_input_chunks_get(chunks_p, i)
            kind = int(M.mtmd_input_chunk_get_type(chunk))
            if kind == CHUNK_TEXT:
                n = ctypes.c_size_t(0)
                ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                out.append(Chunk(kind, [int(ptr[k]) for k in range(n.value)], n.value))
                continue
            n_tokens = int(M.mtmd_input_chunk_get_n_tokens(chunk))
            if int(M.mtmd_input_chunk_get_n_pos(chunk)) != n_tokens:
                raise MediaError("this projector places media at positions other than one per token (M-RoPE)")
            ident = M.mtmd_input_chunk_get_id(chunk)
            out.append(
                Chunk(
                    kind,
                    [],
                    n_tokens,
                    media_id=(ident or b"").decode(),
                    non_causal=bool(M.mtmd_decode_use_non_causal(self.handle, chunk)),
                    # a copy outlives the chunk list, to be encoded when the store lacks it
                    native=int(M.mtmd_input_chunk_copy(chunk) or 0),
                )
            )
        return out

    def encode(self, chunk: Chunk) -> np.ndarray:
        """The chunk's embeddings, (n_tokens, n_embd) float32 (the encoder runs here)."""
        if not chunk.native:
            raise MediaError("this media chunk has no data left to encode")
        with self._lock:
            code = int(M.mtmd_encode_chunk(self.handle, chunk.native))
            if code != 0:
                raise MediaError(f"the media encoder failed (code {code})")
            ptr = M.mtmd_get_output_embd(self.handle)
            flat = np.ctypeslib.as_array(ptr, shape=(chunk.n_tokens * self.n_embd,))
            return flat.reshape(chunk.n_tokens, self.n_embd).copy()

    @staticmethod
    def release(chunks: list[Chunk]) -> None:
        for chunk in chunks:
            if chunk.native:
                M.mtmd_input_chunk_free(chunk.native)
                chunk.native = 0

    def close(self) -> None:
        if self.handle:
            M.mtmd_free(self.handle)
            self.handle = None


def file_caps(path: str) -> tuple[bool, bool]:
    """(vision, audio) of an mmproj file, read from its header only."""
    caps = M.mtmd_get_cap_from_file(path.encode())
    return bool(caps.inp_vision), bool(caps.inp_audio)
