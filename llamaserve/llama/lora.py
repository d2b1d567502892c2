"""LoRA adapters: loaded once per model, applied to a context at chosen scales."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

import llama_cpp.llama_cpp as C

from llamaserve.llama.context import Context
from llamaserve.llama.model import Model


class LoraError(RuntimeError):
    """An adapter file could not be loaded for this model."""


@dataclass
class LoraAdapter:
    path: str
    handle: object  # llama_adapter_lora *

    def close(self) -> None:
        if self.handle:
            C.llama_adapter_lora_free(self.handle)
            self.handle = None


def load_adapters(model: Model, paths: list[str]) -> list[LoraAdapter]:
    adapters: list[LoraAdapter] = []
    for path in paths:
        handle = C.llama_adapter_lora_init(model.handle, os.fsencode(path))
        if not handle:
            for a in adapters:
                a.close()
            raise LoraError(f"failed to load LoRA adapter {path} (is it an adapter for this model?)")
        adapters.append(LoraAdapter(path, handle))
    return adapters


def apply_scales(context: Context, adapters: list[LoraAdapter], scales: tuple[float, ...]) -> None:
    """Make exactly these scales active on the context (the call replaces the whole list).

    Adapters at scale 0 are left out: llama.cpp would skip them anyway, and
    an empty list gives the base model's graph.
    """
    active = [(a, s) for a, s in zip(adapters, scales) if s != 0.0]
    if not active:
        C.llama_set_adapters_lora(context.handle, None, 0, None)
        return
    handles: list[Any] = [a.handle for a, _ in active]  # untyped ctypes pointers
    ptrs = (C.llama_adapter_lora_p_ctypes * len(active))(*handles)
    values = (ctypes.c_float * len(active))(*(s for _, s in active))
    if C.llama_set_adapters_lora(context.handle, ptrs, len(active), values) != 0:
        raise LoraError("llama.cpp refused the LoRA adapter set")
