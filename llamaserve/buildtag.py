"""llama-server's `build_info`, `b<build>-<commit>`, for the llama.cpp our bindings carry.

llama.cpp's build writes it from git (cmake/build-info.cmake: the commit count and the short
commit hash of its checkout, `b0-unknown` without git). The llama-cpp-python wheel records
neither, so the value is kept here per bindings release, read off the sdist's
`vendor/llama.cpp` git metadata (the sdist carries a one-commit clone, so its count is 1: the
C++ llama-server built from the same sources (benchmarks/build_cpp_server.sh) says
`version: 0.5.0-dev (build 1, commit 0c1e570)` and answers `b1-0c1e570`). An unlisted release
says `b0-unknown`, as llama.cpp built without git does. A leaf module: the router reads it
without loading llama.cpp.
"""

from __future__ import annotations

# llama-cpp-python release -> (llama.cpp build number, short commit) of its vendor/llama.cpp
_LLAMA_CPP_BUILDS = {"0.3.36": (1, "0c1e570")}


def bindings_version() -> str:
    from importlib import metadata  # deferred: ~40 ms, and the server passes the version it already has

    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "unknown"


def build_tag(bindings: str | None = None) -> str:
    """`b<build>-<commit>` of the llama.cpp inside llama-cpp-python `bindings` (default: the installed one)."""
    number, commit = _LLAMA_CPP_BUILDS.get(bindings or bindings_version(), (0, "unknown"))
    return f"b{number}-{commit}"
