"""Media files made by the tests themselves: PNG images and WAV tones (numpy, zlib, wave),
FLAC audio and video clips (Debian's ffmpeg, which video input needs anyway)."""

from __future__ import annotations

import io
import struct
import subprocess
import tempfile
import wave
import zlib
from pathlib import Path

import numpy as np


def png(width: int, height: int, seed: int = 0) -> bytes:
    """An RGB PNG of seeded noise (distinct seeds give distinct images)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))  # filter 0 on every row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def wav_tone(seconds: float = 1.0, freq: float = 440.0, rate: int = 16000) -> bytes:
    """A mono 16-bit WAV of a sine tone."""
    t = np.arange(int(seconds * rate)) / rate
    samples = (np.sin(2 * np.pi * freq * t) * 0.3 * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


def flac(wav: bytes) -> bytes:
    """The same audio as FLAC (written to a file: through a pipe ffmpeg cannot go back to fill
    in the stream header's sample count, and miniaudio refuses such a stream)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.wav", Path(tmp) / "out.flac"
        src.write_bytes(wav)
        subprocess.run(["ffmpeg", "-v", "error", "-i", str(src), "-c:a", "flac", str(out)], check=True)
        return out.read_bytes()


def video_clip(seconds: float = 1.0, size: tuple[int, int] = (64, 48), rate: int = 25) -> bytes:
    """An MP4 of ffmpeg's test pattern (MPEG-4 part 2, which every ffmpeg build encodes)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "clip.mp4"
        pattern = f"testsrc=size={size[0]}x{size[1]}:rate={rate}:duration={seconds}"
        subprocess.run(
            ["ffmpeg", "-v", "error", "-f", "lavfi", "-i", pattern, "-c:v", "mpeg4", "-pix_fmt", "yuv420p", str(out)],
            check=True,
        )
        return out.read_bytes()
