"""llama.cpp's mtmd library (multimodal projectors) through llama-cpp-python's ctypes bindings.

`Projector` owns one ``mtmd_context``: it says what the projector takes (vision,
audio, video), decodes media files into bitmaps (``mtmd_helper_bitmap_init_from_buf``:
stb_image for jpeg/png/bmp/gif, miniaudio for wav/mp3/flac, ffmpeg for anything else,
read as a video; the bitmap's id the SHA-256 of the file), splits a prompt with media
markers into text and media chunks (``mtmd_tokenize``; a video becomes its sampled frames
with text timestamps between them, as in llama-server) and runs the encoder on one media
chunk (``mtmd_encode_chunk``), copying its embeddings out. Decoding those embeddings
into the text model's KV is the runner's job (`llama/runner.py`), so the
scheduler owns every ``llama_decode``.

M-RoPE projectors (the Qwen2-VL family) place an image's tokens at four positions each
(time, row, column, extra) and advance the text after it by ``n_pos`` (the larger side of
the grid), not by its token count: each media chunk carries its ``n_pos`` and, for M-RoPE,
every row's positions relative to where the chunk starts.

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
    n_pos: int = 0  # media chunks: positions the chunk takes (n_tokens, except with M-RoPE)
    # M-RoPE media chunks: (n_tokens, 4) int32 positions of each row for a chunk starting at 0,
    # and what each gains per position the chunk starts further on (1: relative, 0: fixed).
    sections: np.ndarray | None = None
    section_steps: np.ndarray | None = None


@dataclass(frozen=True)
class ProjectorSettings:
    use_gpu: bool = True
    n_threads: int = 4
    flash_attn: str = "auto"
    image_min_tokens: int = -1  # -1: the projector's own
    image_max_tokens: int = -1
    warmup: bool = True
    marker: str = ""  # "": mtmd's default marker
    device: int = 0  # -mmdev: the ggml device to run on; 0: mtmd's choice (follows --device)
    batch_max_tokens: int = 1024  # --mtmd-batch-max-tokens
    video_fps: float = 4.0  # --video-fps (<= 0: the video's own rate)
    video_timestamp_interval_ms: int = 5000  # --video-timestamp-interval (<= 0: no timestamps)
    video_ffmpeg_dir: str = ""  # --video-ffmpeg-dir ("": ffmpeg and ffprobe from PATH)


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
        params.batch_max_tokens = settings.batch_max_tokens
        if settings.device:
            params.device = settings.device
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
        # Video: this libmtmd was built with MTMD_VIDEO (it runs ffmpeg/ffprobe), as llama-server asks.
        self.video: bool = self.vision and bool(M.mtmd_helper_support_video(handle))
        self._ffmpeg_dir = settings.video_ffmpeg_dir.encode() if settings.video_ffmpeg_dir else None
        opt = M.mtmd_helper_init_opt_default()
        opt.video_params.fps_target = settings.video_fps
        opt.video_params.timestamp_interval_ms = settings.video_timestamp_interval_ms
        opt.video_params.ffmpeg_bin_dir = self._ffmpeg_dir  # kept alive by self._ffmpeg_dir
        self._init_opt = opt

    # ---------------------------------------------------------------- media
    def _bitmap(self, data: bytes, index: int, videos: list[int]) -> int:
        """The media's bitmap; a video's stream (read while the prompt is tokenized) joins ``videos``."""
        if not data:
            raise MediaError(f"media {index} is empty")
        buf = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
        out = M.mtmd_helper_bitmap_init_from_buf_wrapper(self.handle, buf, len(data), False, self._init_opt)
        if out.video_ctx:
            videos.append(int(out.video_ctx))
        bitmap = out.bitmap
        if not bitmap:
            video = "; video: anything ffmpeg reads" if self.video else ""
            raise MediaError(
                f"media {index} could not be decoded: not an image{', audio' if self.audio else ''}"
                f"{' or video' if self.video else ''} file this model takes "
                f"(images: jpeg, png, bmp, gif{'; audio: wav, mp3, flac' if self.audio else ''}{video})"
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
        videos: list[int] = []
        chunks_p = None
        try:
            for i, data in enumerate(media):
                bitmaps.append(self._bitmap(data, i, videos))
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
            for video in videos:  # stops its ffmpeg
                M.mtmd_helper_video_free(video)
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
            ident = M.mtmd_input_chunk_get_id(chunk)
            sections, steps = self._sections(chunk, n_tokens) if self.mrope else (None, None)
            out.append(
                Chunk(
                    kind,
                    [],
                    n_tokens,
                    media_id=(ident or b"").decode(),
                    non_causal=bool(M.mtmd_decode_use_non_causal(self.handle, chunk)),
                    # a copy outlives the chunk list, to be encoded when the store lacks it
                    native=int(M.mtmd_input_chunk_copy(chunk) or 0),
                    n_pos=int(M.mtmd_input_chunk_get_n_pos(chunk)),
                    sections=sections,
                    section_steps=steps,
                )
            )
        return out

    @staticmethod
    def _sections(chunk: int, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """An M-RoPE chunk's four positions per row (time, row, column, extra), in the order
        mtmd's decode helper writes them, for a chunk at position 0, and their gain per position
        the chunk starts further on: what ``mtmd_helper_decode_image_chunk`` would place."""
        image = M.mtmd_input_chunk_get_tokens_image(chunk)
        if not image:  # audio: one position after another, the same in every section
            rows = np.repeat(np.arange(n_tokens, dtype=np.int32)[:, None], 4, axis=1)
            return rows, np.ones((n_tokens, 4), dtype=np.int32)

        def at(pos_0: int) -> np.ndarray:
            out = (M.mtmd_decoder_pos * n_tokens)()
            M.mtmd_helper_image_get_decoder_pos(image, pos_0, out)
            return np.array([(p.t, p.y, p.x, p.z) for p in out], dtype=np.int64)

        base = at(0)
        return base.astype(np.int32), (at(1) - base).astype(np.int32)

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
