"""Control vectors (--control-vector, --control-vector-scaled, --control-vector-layer-range).

A control vector file is a GGUF with one F32 tensor `direction.<layer>` per layer (layer 1 first).
The vectors of all files, each times its scale, are summed per layer and handed to
llama_set_adapter_cvec, which adds them to the hidden state after each layer, as llama-server does.
The file is read with ggml's own GGUF reader (through ctypes) for the tensor table, then numpy
for the numbers, so no GGUF library of ours is needed.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp.llama_cpp as C
import numpy as np

from llamaserve.llama.context import Context
from llamaserve.llama.devices import native_library

# The ggml llama-cpp-python loaded (LLAMA_CPP_LIB_PATH honoured): a second copy from the package's
# own folder would be another library, with tensors the loaded model's ggml does not know.
_base = native_library("libggml-base.so")
_GGML_TYPE_F32 = 0


class _GgufInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


_base.gguf_init_from_file.argtypes = [ctypes.c_char_p, _GgufInitParams]
_base.gguf_init_from_file.restype = ctypes.c_void_p
_base.gguf_get_n_tensors.argtypes = [ctypes.c_void_p]
_base.gguf_get_n_tensors.restype = ctypes.c_int64
_base.gguf_get_tensor_name.argtypes = [ctypes.c_void_p, ctypes.c_int64]
_base.gguf_get_tensor_name.restype = ctypes.c_char_p
_base.gguf_get_tensor_type.argtypes = [ctypes.c_void_p, ctypes.c_int64]
_base.gguf_get_tensor_type.restype = ctypes.c_int
for _fn in ("gguf_get_tensor_offset", "gguf_get_tensor_size"):
    getattr(_base, _fn).argtypes = [ctypes.c_void_p, ctypes.c_int64]
    getattr(_base, _fn).restype = ctypes.c_size_t
_base.gguf_get_data_offset.argtypes = [ctypes.c_void_p]
_base.gguf_get_data_offset.restype = ctypes.c_size_t
_base.gguf_free.argtypes = [ctypes.c_void_p]
_base.gguf_free.restype = None


class ControlVectorError(ValueError):
    """A control vector file that cannot be used with this model."""


@dataclass(frozen=True)
class ControlVector:
    n_embd: int
    data: np.ndarray  # float32, n_embd per layer, layer 1 first


def _directions(path: str) -> dict[int, np.ndarray]:
    """layer -> its direction, summed if a file repeats a layer."""
    handle = _base.gguf_init_from_file(path.encode(), _GgufInitParams(True, None))
    if not handle:
        raise ControlVectorError(f"failed to load control vector file from {path}")
    try:
        data_offset = int(_base.gguf_get_data_offset(handle))
        table: list[tuple[int, int, int]] = []  # (layer, file offset, bytes)
        for i in range(int(_base.gguf_get_n_tensors(handle))):
            name = (_base.gguf_get_tensor_name(handle, i) or b"").decode()
            prefix, _, index = name.partition(".")
            if prefix != "direction" or not index.isdigit() or int(index) == 0:
                raise ControlVectorError(f"{path}: invalid direction tensor name '{name}'")
            if _base.gguf_get_tensor_type(handle, i) != _GGML_TYPE_F32:
                raise ControlVectorError(f"{path}: direction tensor '{name}' is not F32")
            offset = data_offset + int(_base.gguf_get_tensor_offset(handle, i))
            table.append((int(index), offset, int(_base.gguf_get_tensor_size(handle, i))))
    finally:
        _base.gguf_free(handle)
    out: dict[int, np.ndarray] = {}
    with open(path, "rb") as fh:
        for layer, offset, size in table:
            fh.seek(offset)
            vector = np.frombuffer(fh.read(size), dtype=np.float32)
            out[layer] = out[layer] + vector if layer in out else vector.copy()
    return out


def load(files: list[tuple[str, float]]) -> ControlVector:
    """Sum `(path, scale)` files into one vector per layer; every file must have the same width."""
    n_embd = -1
    layers: dict[int, np.ndarray] = {}
    for path, scale in files:
        for layer, vector in _directions(path).items():
            if n_embd == -1:
                n_embd = vector.size
            elif vector.size != n_embd:
                raise ControlVectorError(f"{path}: direction width {vector.size} does not match {n_embd}")
            layers[layer] = layers.get(layer, np.zeros(n_embd, np.float32)) + vector * np.float32(scale)
    if n_embd == -1:
        raise ControlVectorError("no direction tensors in the control vector files")
    data = np.zeros(n_embd * max(layers), np.float32)
    for layer, vector in layers.items():
        data[(layer - 1) * n_embd : layer * n_embd] = vector
    return ControlVector(n_embd, data)


def apply(context: Context, vector: ControlVector, layer_start: int, layer_end: int) -> None:
    """Add the vector to the context's hidden states on layers [start, end] (-1, -1: all)."""
    buf = np.ascontiguousarray(vector.data, dtype=np.float32)
    pointer = buf.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    err = C.llama_set_adapter_cvec(context.handle, pointer, buf.size, vector.n_embd, layer_start, layer_end)
    if err:
        raise ControlVectorError(f"the control vector does not fit this model (n_embd {vector.n_embd})")
