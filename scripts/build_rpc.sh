#!/usr/bin/env bash
# Builds llama.cpp with its RPC backend (GGML_RPC=ON) from the llama-cpp-python sdist that
# llamaserve uses, into .rpc/ (git-ignored): .rpc/lib holds a shared libllama with its ggml
# libraries, which llama-cpp-python loads when LLAMA_CPP_LIB_PATH=.rpc/lib, and
# .rpc/bin/rpc-server is llama.cpp's RPC server. The installed llama-cpp-python is left as it
# is. scripts/bootstrap runs it (unless --no-rpc); idempotent (FORCE=1 rebuilds). Measured:
# 207 s on 2 cores that were compiling llama-cpp-python at the same time.
#
# Environment: SDIST_DIR (an unpacked llama_cpp_python-0.3.36; default: downloaded),
# JOBS (default 2), NICE (default 10), PYTHON (for pip download, default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="$PWD/.rpc"
JOBS="${JOBS:-2}"
NICE="${NICE:-10}"
PYTHON="${PYTHON:-.venv/bin/python}"
VER=0.3.36
if [[ -x "$OUT/bin/rpc-server" && -f "$OUT/lib/libllama.so" && "${FORCE:-0}" != 1 ]]; then
    echo "rpc build already present in $OUT (FORCE=1 to rebuild)" >&2
    exit 0
fi
SRC="${SDIST_DIR:-}"
if [[ -z "$SRC" ]]; then
    SRC="$OUT/src/llama_cpp_python-$VER"
    if [[ ! -d "$SRC/vendor/llama.cpp" ]]; then
        mkdir -p "$OUT/src"
        "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$OUT/src"
        tar -xzf "$OUT/src/llama_cpp_python-$VER.tar.gz" -C "$OUT/src"
    fi
fi
FLAGS=""
if [[ "$(uname -m)" == x86_64 ]]; then
    FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # as scripts/bootstrap builds llama-cpp-python
fi
start=$(date +%s)
CFLAGS="$FLAGS" CXXFLAGS="$FLAGS" cmake -S "$SRC/vendor/llama.cpp" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON >&2
nice -n "$NICE" cmake --build "$OUT/build" --config Release -j "$JOBS" --target llama ggml-rpc-server >&2
mkdir -p "$OUT/lib" "$OUT/bin"
# The libraries find each other through $ORIGIN: a libllama whose run path named the build
# folder would load a second libggml there, with its own device registry.
find "$OUT/build/bin" -maxdepth 1 -name '*.so*' -exec cp -P {} "$OUT/lib/" \;
cp "$OUT/build/bin/ggml-rpc-server" "$OUT/lib/rpc-server"
ln -sf ../lib/rpc-server "$OUT/bin/rpc-server"
echo "rpc build done in $(($(date +%s) - start)) s: LLAMA_CPP_LIB_PATH=$OUT/lib, $OUT/bin/rpc-server" >&2
