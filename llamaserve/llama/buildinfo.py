"""What the loaded llama.cpp was built with, for `llama version`.

llama-cpp-python records no llama.cpp commit in its libraries (the C++ tools get
theirs from `common/build-info`, which the bindings do not build), so the best
the library can say is its own version string, the backends it offloads to and
the CPU features compiled in.
"""

from __future__ import annotations

from dataclasses import dataclass

import llama_cpp
import llama_cpp.llama_cpp as C


@dataclass(frozen=True)
class BuildInfo:
    bindings_version: str  # llama-cpp-python
    llama_version: str  # llama.cpp's llama_version(), e.g. "0.5.0-dev"
    gpu_offload: bool  # built with a GPU backend (CUDA, Metal, Vulkan…) that can take layers
    system_info: str  # llama_print_system_info(): compiled-in backends and CPU features


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", errors="replace").strip()


def build_info() -> BuildInfo:
    return BuildInfo(
        bindings_version=str(llama_cpp.__version__),
        llama_version=_text(C.llama_version()),
        gpu_offload=bool(C.llama_supports_gpu_offload()),
        system_info=_text(C.llama_print_system_info()).rstrip("| ").strip(),
    )
