#!/usr/bin/env bash
# Build the C++ llama.cpp `llama-server` for side-by-side benchmarking.
#
# The source is the llama.cpp tree vendored in the llama-cpp-python sdist, of
# the same version that llamaserve uses (detected from .venv, default 0.3.36),
# so both servers run identical ggml kernels. Build flags mirror
# llama-cpp-python's default Linux build (GGML_NATIVE=ON, OpenMP when found,
# Release), except that libraries are linked statically so the binary is
# self-contained, and that AMX is compiled out when the CPU advertises it but
# cannot execute it (see amx_probe.c). With CUDA (the same choice as scripts/bootstrap
# makes for llama-cpp-python, in scripts/gpu.sh) the CUDA backend is built in too.
#
# Idempotent: if the binary exists it is not rebuilt (FORCE=1 to rebuild).
# Logs go to stderr; the last line on stdout is the binary path, so
#   BIN=$(benchmarks/build_cpp_server.sh)
# works.
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  sdist version to take llama.cpp from
#   CPP_SERVER_DIR            output dir (default benchmarks/.cpp-server)
#   JOBS                      parallel compile jobs (default 2)
#   NICE                      nice level for the compile (default 10)
#   PYTHON                    python used for `pip download` (default python3)
#   AMX                       auto (default: probe the CPU), on, off
#   EXTRA_CMAKE_ARGS          extra cmake flags (word-split), e.g. to match the
#                             CMAKE_ARGS llama-cpp-python was built with
#   LLAMASERVE_CUDA           1: CUDA build, 0: CPU build, unset: CUDA when a GPU and nvcc
#                             are found (scripts/gpu.sh)
#   CUDA_ARCHITECTURES        CUDA build only: e.g. "90" (default: the visible GPUs')
#   FORCE=1                   rebuild even if the binary exists
#   DRY_RUN=1                 print the backend and cmake flags, build nothing
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
OUT="${CPP_SERVER_DIR:-$HERE/.cpp-server}"
BIN="$OUT/llama-server"
JOBS="${JOBS:-2}"
NICE="${NICE:-10}"
PYTHON="${PYTHON:-python3}"

log() { echo "[build_cpp_server] $*" >&2; }

# shellcheck source=../scripts/gpu.sh
source "$ROOT/scripts/gpu.sh"
BACKEND=cpu
BACKEND_FLAGS=()
if llamaserve_want_cuda; then
    BACKEND=cuda
    # shellcheck disable=SC2207  # the flags are words
    BACKEND_FLAGS=($(llamaserve_cuda_cmake_args))
    NVCC="$(llamaserve_nvcc)"
    [[ -z "$NVCC" || -n "${CUDACXX:-}" ]] || export CUDACXX="$NVCC"
fi

# A binary built for the other backend does not count (a BUILD_INFO without the line predates CUDA: CPU).
built_backend() {
    local b
    b="$(sed -n 's/^backend: //p' "$OUT/BUILD_INFO" 2>/dev/null || true)"
    echo "${b:-cpu}"
}
if [[ -x "$BIN" && "${FORCE:-0}" != "1" && "${DRY_RUN:-0}" != "1" && "$(built_backend)" == "$BACKEND" ]]; then
    log "binary already present, skipping build (FORCE=1 to rebuild)"
    echo "$BIN"
    exit 0
fi

for tool in cmake "${CXX:-c++}"; do
    command -v "$tool" >/dev/null || { log "missing required tool: $tool"; exit 1; }
done

VER="${LLAMA_CPP_PYTHON_VERSION:-}"
if [[ -z "$VER" && -x "$ROOT/.venv/bin/python" ]]; then
    VER="$("$ROOT/.venv/bin/python" -c \
        'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null || true)"
fi
VER="${VER:-0.3.36}"
log "llama.cpp source: llama-cpp-python==$VER sdist (vendor/llama.cpp)"

SRC_ROOT="$OUT/src"
SDIST="$SRC_ROOT/llama_cpp_python-$VER.tar.gz"
TREE="$SRC_ROOT/llama_cpp_python-$VER"
LLAMA_SRC="$TREE/vendor/llama.cpp"
BUILD="$OUT/build-$VER"
[[ "$BACKEND" == cpu ]] || BUILD="$BUILD-$BACKEND"
if [[ "${DRY_RUN:-0}" != "1" ]]; then
    mkdir -p "$SRC_ROOT"
fi

if [[ "${DRY_RUN:-0}" == "1" ]]; then
    :  # nothing fetched, nothing built
elif [[ ! -f "$SDIST" ]]; then
    log "downloading sdist"
    "$PYTHON" -m pip download "llama-cpp-python==$VER" --no-deps --no-binary :all: \
        -d "$SRC_ROOT" >&2
fi
if [[ "${DRY_RUN:-0}" != "1" && ! -f "$LLAMA_SRC/CMakeLists.txt" ]]; then
    log "extracting $SDIST"
    rm -rf "$TREE"
    tar -xzf "$SDIST" -C "$SRC_ROOT"
fi

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)

# AMX: -march=native enables ggml's AMX kernels whenever CPUID lists AMX, but
# in VMs the tile state is often not enabled and the first AMX instruction
# raises SIGILL at model load. Probe it and compile AMX out if it faults.
amx_works() {
    local probe="$OUT/amx-probe"
    "${CC:-cc}" -O1 -mamx-tile "$HERE/amx_probe.c" -o "$probe" 2>/dev/null || return 1
    ("$probe") >/dev/null 2>&1
}

EXTRA_FLAGS=""
AMX="${AMX:-auto}"
if [[ "$AMX" == "auto" && "${DRY_RUN:-0}" == "1" ]]; then
    AMX="auto (probed when building)"  # the probe compiles into $OUT: not in a dry run
fi
if [[ "$(uname -m)" == "x86_64" ]]; then
    if [[ "$AMX" == "auto" ]]; then
        # The compiler's macros are read whole first: `cc ... | grep -q` under pipefail fails
        # whenever grep quits before cc has written everything (SIGPIPE), which read as "no AMX".
        native_macros="$(echo | "${CC:-cc}" -march=native -dM -E - 2>/dev/null || true)"
        if ! grep -q __AMX_TILE__ <<<"$native_macros"; then
            AMX="not enabled by -march=native"
        elif amx_works; then
            AMX="on"
        else
            log "the CPU advertises AMX but AMX instructions fault here: compiling AMX out"
            AMX="off"
        fi
    fi
    if [[ "$AMX" == "off" ]]; then
        EXTRA_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    fi
fi
log "AMX: $AMX"

# No network at build time: no web UI (npm / HF download), no HTTPS, no curl.
CMAKE_FLAGS=(
    -DCMAKE_BUILD_TYPE=Release
    -DGGML_NATIVE=ON
    -DBUILD_SHARED_LIBS=OFF
    -DLLAMA_BUILD_COMMON=ON
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF
    "${BACKEND_FLAGS[@]}"
    "-DCMAKE_C_FLAGS=${CFLAGS:-} $EXTRA_FLAGS"
    "-DCMAKE_CXX_FLAGS=${CXXFLAGS:-} $EXTRA_FLAGS"
)
# shellcheck disable=SC2206  # word splitting intended
CMAKE_FLAGS+=(${EXTRA_CMAKE_ARGS:-})

if [[ "${DRY_RUN:-0}" == "1" ]]; then
    log "dry run: backend $BACKEND, AMX $AMX"
    echo "backend $BACKEND: cmake ${CMAKE_FLAGS[*]}"
    exit 0
fi

log "configuring in $BUILD"
cmake -S "$LLAMA_SRC" -B "$BUILD" "${GEN[@]}" "${CMAKE_FLAGS[@]}" >&2

log "compiling llama-server with -j$JOBS at nice $NICE (several minutes on 2 cores)"
nice -n "$NICE" cmake --build "$BUILD" --target llama-server -j "$JOBS" >&2

cp -f "$BUILD/bin/llama-server" "$BIN.tmp"
mv -f "$BIN.tmp" "$BIN"
{
    echo "llama-cpp-python sdist: $VER"
    echo "cmake flags: ${CMAKE_FLAGS[*]}"
    echo "AMX: $AMX"
    echo "backend: $BACKEND"
    # The sdist carries its git metadata, so this is llama.cpp's own commit.
    "$BIN" --version 2>&1 | head -n 1
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$OUT/BUILD_INFO"

"$BIN" --version >&2 2>&1 || true
log "done"
echo "$BIN"
