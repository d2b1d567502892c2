"""A small reader for the safetensors format, numpy only (no torch, no safetensors package).

Layout of a ``.safetensors`` file: an unsigned 64-bit little-endian header length N,
then N bytes of UTF-8 JSON mapping tensor names to ``{"dtype", "shape", "data_offsets"}``
(offsets relative to the end of the header; an optional ``__metadata__`` entry holds
strings), then the raw little-endian tensor bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# safetensors dtype name -> numpy dtype; BF16 is read as raw uint16 and widened below.
_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}

# A header larger than this is not a safetensors file we want to trust.
_MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    pass


class SafetensorsFile:
    """Lazily reads tensors from one ``.safetensors`` file through a read-only memory map."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise SafetensorsError(f"{self.path}: too short for a safetensors header")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                raise SafetensorsError(f"{self.path}: header length {n} is implausible")
            header_bytes = f.read(n)
            if len(header_bytes) != n:
                raise SafetensorsError(f"{self.path}: truncated header")
        try:
            header = json.loads(header_bytes.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SafetensorsError(f"{self.path}: bad header JSON: {e}") from None
        if not isinstance(header, dict):
            raise SafetensorsError(f"{self.path}: header is not an object")
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._entries: dict[str, dict] = header
        self._data_start = 8 + n
        self._data_len = self.path.stat().st_size - self._data_start
        self._mmap: np.memmap | None = None

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def _buffer(self) -> np.memmap:
        if self._mmap is None:
            self._mmap = np.memmap(
                self.path, dtype=np.uint8, mode="r", offset=self._data_start, shape=(self._data_len,)
            )
        return self._mmap

    def get(self, name: str) -> np.ndarray:
        """The tensor as a numpy array (a copy; BF16 is widened to float32)."""
        entry = self._entries[name]
        dtype_name = entry["dtype"]
        if dtype_name not in _DTYPES:
            raise SafetensorsError(f"{name}: unsupported dtype {dtype_name}")
        dtype = _DTYPES[dtype_name]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - begin != count * dtype.itemsize or begin < 0 or end > self._data_len:
            raise SafetensorsError(f"{name}: data offsets {begin}..{end} do not fit dtype/shape")
        arr = np.frombuffer(self._buffer(), dtype=dtype, count=count, offset=begin).reshape(shape)
        if dtype_name == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32)
        return arr.astype(dtype.newbyteorder("="), copy=True)

    def items(self) -> Iterator[tuple[str, np.ndarray]]:
        for name in self._entries:
            yield name, self.get(name)


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one file, by name."""
    return dict(SafetensorsFile(path).items())
