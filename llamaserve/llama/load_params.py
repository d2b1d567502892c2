"""llama_model_params from plain settings: placement, loading mode, metadata and tensor overrides.

The ctypes arrays the params point into must outlive the load call, so `build` returns them with
the params and the caller keeps them until loading is done.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import llama_cpp.llama_cpp as C

from llamaserve.llama.devices import DeviceError, add_rpc_servers, buffer_types, pick_devices

SPLIT_MODES = {
    "none": C.LLAMA_SPLIT_MODE_NONE,
    "layer": C.LLAMA_SPLIT_MODE_LAYER,
    "row": C.LLAMA_SPLIT_MODE_ROW,
    "tensor": C.LLAMA_SPLIT_MODE_TENSOR,
}
LOAD_MODES = {
    "auto": C.LLAMA_LOAD_MODE_AUTO,
    "none": C.LLAMA_LOAD_MODE_NONE,
    "mmap": C.LLAMA_LOAD_MODE_MMAP,
    "mlock": C.LLAMA_LOAD_MODE_MLOCK,
    "mmap+mlock": C.LLAMA_LOAD_MODE_MMAP_MLOCK,
    "dio": C.LLAMA_LOAD_MODE_DIRECT_IO,
}
LAZY_MODES = {"off": C.LLAMA_LAZY_MODE_OFF, "auto": C.LLAMA_LAZY_MODE_AUTO, "on": C.LLAMA_LAZY_MODE_ON}
_KV_TYPES = {
    "int": C.LLAMA_KV_OVERRIDE_TYPE_INT,
    "float": C.LLAMA_KV_OVERRIDE_TYPE_FLOAT,
    "bool": C.LLAMA_KV_OVERRIDE_TYPE_BOOL,
    "str": C.LLAMA_KV_OVERRIDE_TYPE_STR,
}


class LoadSettingsError(ValueError):
    """A loading setting this llama.cpp cannot use (an unknown device, a bad override)."""


@dataclass(frozen=True)
class ModelLoadSettings:
    n_gpu_layers: int = -1  # negative: all layers (llama.cpp's meaning; only a GPU build offloads)
    split_mode: str = "layer"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    devices: str | None = None  # "A,B" or "none"; None: every device
    load_mode: str = "auto"
    lazy_mode: str = "auto"
    check_tensors: bool = False
    repack: bool = True
    no_host: bool = False
    override_kv: tuple[str, ...] = ()  # KEY=TYPE:VALUE
    override_tensor: tuple[str, ...] = ()  # PATTERN=BUFFER_TYPE
    rpc_servers: tuple[str, ...] = ()  # --rpc host:port endpoints, added as devices before the load


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _kv_overrides(items: tuple[str, ...]) -> Any:
    arr = (C.llama_model_kv_override * (len(items) + 1))()  # zeroed: the last is the terminator
    for i, item in enumerate(items):
        key, eq, rest = item.partition("=")
        kind, colon, value = rest.partition(":")
        if not (eq and colon and key) or kind not in _KV_TYPES:
            raise LoadSettingsError(
                f"--override-kv: expected KEY=TYPE:VALUE with TYPE int, float, bool or str: '{item}'"
            )
        if len(key.encode()) >= 128:
            raise LoadSettingsError(f"--override-kv: key too long: '{key}'")
        entry = arr[i]
        entry.key = key.encode()
        entry.tag = _KV_TYPES[kind]
        slot: Any = entry.value  # the union; llama-cpp-python's stub types it as a plain value
        try:
            if kind == "int":
                slot.val_i64 = int(value)
            elif kind == "float":
                slot.val_f64 = float(value)
            elif kind == "bool":
                if value not in ("true", "false"):
                    raise ValueError
                slot.val_bool = value == "true"
            else:
                if len(value.encode()) >= 128:
                    raise LoadSettingsError(f"--override-kv: string value too long: '{item}'")
                slot.val_str = value.encode()
        except ValueError:
            raise LoadSettingsError(f"--override-kv: '{value}' is not a valid {kind}") from None
    return arr


def _tensor_overrides(items: tuple[str, ...]) -> tuple[Any, list[bytes]]:
    known = buffer_types()
    arr = (_BuftOverride * (len(items) + 1))()
    patterns: list[bytes] = []
    for i, item in enumerate(items):
        pattern, eq, name = item.rpartition("=")
        if not eq or not pattern:
            raise LoadSettingsError(f"--override-tensor: expected PATTERN=BUFFER_TYPE, got '{item}'")
        if name not in known:
            raise LoadSettingsError(f"--override-tensor: unknown buffer type '{name}' (available: {', '.join(known)})")
        patterns.append(pattern.encode())
        arr[i].pattern = patterns[-1]
        arr[i].buft = known[name]
    return arr, patterns


def build(settings: ModelLoadSettings, *, vocab_only: bool = False) -> tuple[Any, list[Any]]:
    """(llama_model_params, the objects it points into)."""
    if settings.rpc_servers:
        try:
            add_rpc_servers(settings.rpc_servers)
        except DeviceError as exc:
            raise LoadSettingsError(str(exc)) from exc
    params = C.llama_model_default_params()
    keep: list[Any] = []
    params.n_gpu_layers = settings.n_gpu_layers if settings.n_gpu_layers >= 0 else -1
    params.split_mode = SPLIT_MODES[settings.split_mode]
    params.main_gpu = settings.main_gpu
    params.load_mode = LOAD_MODES[settings.load_mode]
    params.lazy_mode = LAZY_MODES[settings.lazy_mode]
    params.check_tensors = settings.check_tensors
    params.use_extra_bufts = settings.repack
    params.no_host = settings.no_host
    params.vocab_only = vocab_only
    if settings.tensor_split:
        n = int(C.llama_max_devices())
        if len(settings.tensor_split) >= n + 1:
            raise LoadSettingsError(f"--tensor-split: {len(settings.tensor_split)} values, but at most {n} devices")
        split = (ctypes.c_float * n)(*settings.tensor_split)
        keep.append(split)
        params.tensor_split = split
    if settings.devices is not None:
        try:
            chosen = pick_devices(settings.devices)
        except DeviceError as exc:
            raise LoadSettingsError(str(exc)) from exc
        devices = (ctypes.c_void_p * (len(chosen) + 1))(*[d.handle for d in chosen])
        keep.append(devices)
        params.devices = ctypes.cast(devices, ctypes.c_void_p)
    if settings.override_kv:
        kv = _kv_overrides(settings.override_kv)
        keep.append(kv)
        params.kv_overrides = kv
    if settings.override_tensor:
        tensors, patterns = _tensor_overrides(settings.override_tensor)
        keep += [tensors, patterns]
        params.tensor_buft_overrides = ctypes.cast(tensors, ctypes.c_void_p)
    return params, keep
