#!/usr/bin/env bash
# The GPU check: llamaserve against the C++ llama-server on one GPU, in one call of a machine with
# no network (the lent H200: 16 cores, Python 3.12 with numpy, cmake, ninja and nvcc). CI never
# runs it. Prepare its folder here first, then name it in the call's carry:
#
#   benchmarks/gpu_pack.sh                                 # .gpucheck/: sources, wheels, tokenizer
#   OUT=/some/dir benchmarks/gpu_check.sh                  # there (GPU_CHECK_MODE=gpu, the default)
#   PYTHON=$(benchmarks/gpu_rehearsal_env.sh /tmp/dev312) \
#   GPU_CHECK_MODE=cpu OUT=/tmp/gc benchmarks/gpu_check.sh # the same path on this CPU, tiny shapes
#
# Steps, each cut at what is left of GPU_CHECK_SECONDS (gpu: 480, cpu: 3000):
#   1. the carried wheels into $WORK/site (pip --no-index --no-deps), llama-cpp-python's pure-Python
#      package from the pack on PYTHONPATH;
#   2. llama.cpp from the pack compiled ONCE: shared libllama/ggml/mtmd and llama-server (gpu: CUDA,
#      sm_90 only); ours loads those libraries (LLAMA_CPP_LIB_PATH, MTMD_CPP_LIB), the C++ server is
#      the same build's binary. Meanwhile benchmarks/gpu_models.py writes the models: random Q8_0
#      weights in the shapes of Llama-3.2-1B and Llama-3.1-8B (cpu: two tiny shapes) with SmolLM2's
#      tokenizer padded to Llama-3's 128,256 tokens;
#   3. per shape, benchmarks/serve_bench.py on both servers taking turns, the same flags on both
#      (-ngl 99 -fa on -np/-c/-kvu alike): single-stream decode, prefill of a ~4k-token prompt
#      (cpu: ~512), aggregate tok/s and TTFT p50 at 16 and 64 streaming clients (cpu: 2 and 4),
#      greedy with ignore_eos;
#   4. the serving ceiling (benchmarks/serving_ceiling.py): our whole server over a runner that
#      sleeps a GPU-like step instead of decoding, on this machine's cores, against the ideal
#      tokens/s, at 1 stream / 1.5 ms, 64 / 5 ms and 256 / 10 ms (the first shape's vocabulary);
#   5. the summary table (benchmarks/gpu_summary.py), printed last.
#
# $OUT receives at most 7 files: summary.txt (every step's outcome, then the tables), table.md,
# results.json (both shapes' serve_bench results), report.md (serve_bench's own tables),
# ceiling.md (the serving ceiling's table and rows), machine.txt, logs.tar.gz (build, model,
# bench and server logs).
# Exit codes: 0 all ran, 1 a step failed or was cut, 2 no GPU or no nvcc in gpu mode, 3 no pack or an interpreter that is not Python 3.12.
#
# Environment: GPU_CHECK_MODE (gpu|cpu), GPU_CHECK_SECONDS, GPU_PACK_DIR (default .gpucheck),
# GPU_CHECK_WORK (build, models, site-packages; default /tmp/gpucheck-MODE: a second run there
# reuses the build), PYTHON (default python3), JOBS (default nproc), GPU_CHECK_SHAPES (default
# "1b 8b", cpu "tiny1 tiny2").
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
: "${OUT:?set OUT to the folder that receives the results}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
BEGIN=$(date +%s)
MODE="${GPU_CHECK_MODE:-gpu}"
case "$MODE" in
gpu) BUDGET="${GPU_CHECK_SECONDS:-480}" ;;
cpu) BUDGET="${GPU_CHECK_SECONDS:-3000}" ;;
*)
    echo "GPU_CHECK_MODE must be gpu or cpu, got '$MODE'" >&2
    exit 2
    ;;
esac
PACK="$(cd "${GPU_PACK_DIR:-$ROOT/.gpucheck}" 2>/dev/null && pwd || true)"
WORK="${GPU_CHECK_WORK:-/tmp/gpucheck-$MODE}"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
LOGS="$WORK/logs"
mkdir -p "$WORK" "$LOGS"
rm -f "$LOGS"/*.log "$OUT/summary.txt"
FAILED=0

elapsed() { echo $(($(date +%s) - BEGIN)); }
left() { echo $((BUDGET - $(elapsed))); }
say() { echo "[gpu_check $MODE +$(elapsed)s] $*" | tee -a "$OUT/summary.txt" >&2; }

# Whatever happens, the logs come back in one file.
pack_logs() { tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs 2>/dev/null; }
trap pack_logs EXIT

# step NAME LIMIT CMD...: CMD's output to $LOGS/NAME.log, cut at LIMIT seconds or what is left of the
# budget less RESERVE (kept for the steps after it).
RESERVE=0
step() {
    local name="$1" limit="$2" rc t0 avail
    shift 2
    avail=$(($(left) - RESERVE))
    [ "$avail" -lt "$limit" ] && limit="$avail"
    if [ "$limit" -lt 10 ]; then
        say "$name: SKIPPED (no time left in the ${BUDGET}s budget)"
        return 124
    fi
    t0=$(date +%s)
    timeout --kill-after=20 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    local took=$(($(date +%s) - t0))
    if [ "$rc" -eq 0 ]; then
        say "$name: ok in ${took}s"
    else
        if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            say "$name: TIMED OUT after ${took}s (limit ${limit}s); tail of its log:"
        else
            say "$name: FAILED (exit $rc) in ${took}s; tail of its log:"
        fi
        tail -n 12 "$LOGS/$name.log" | cut -c1-300 | sed 's/^/    /' | tee -a "$OUT/summary.txt" >&2
    fi
    return "$rc"
}

# cmake and ninja may be Python packages beside the interpreter rather than on PATH.
PY_BIN="$(dirname "$(command -v "$PY" || echo /nonexistent/python)")"
for tool in cmake ninja; do
    if ! command -v "$tool" >/dev/null && [ -x "$PY_BIN/$tool" ]; then
        export PATH="$PATH:$PY_BIN"
    fi
done
GENERATOR=Ninja
if ! command -v ninja >/dev/null; then
    say "no ninja: building with make"
    GENERATOR="Unix Makefiles"
fi

# ---------------------------------------------------------------- the machine
{
    echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) mode $MODE, $(nproc) cores, budget ${BUDGET}s"
    echo "== git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    timeout 20 nvidia-smi 2>&1 || echo "nvidia-smi: not available"
    echo "== nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || echo none)"
    (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 | tail -n 2
    echo "== cmake: $(cmake --version 2>&1 | head -n 1), ninja: $(ninja --version 2>&1)"
    echo "== python: $(command -v "$PY") $("$PY" --version 2>&1)"
    grep -m1 'model name' /proc/cpuinfo
    free -g 2>/dev/null
    df -h "$WORK" 2>/dev/null | tail -n 1
} >"$OUT/machine.txt" 2>&1

if [ -z "$PACK" ] || [ ! -f "$PACK/llama.cpp.tar.xz" ] || [ ! -d "$PACK/whl" ] || [ ! -d "$PACK/py/llama_cpp" ]; then
    say "STOP: no pack at ${GPU_PACK_DIR:-$ROOT/.gpucheck} (run benchmarks/gpu_pack.sh here, then name .gpucheck in carry)"
    exit 3
fi
# The carried wheels are cp312 (the device's python3): another interpreter cannot install them, and
# everything after would fail for want of gguf and fastapi. On a CPU, rehearse with a 3.12 venv
# (benchmarks/gpu_rehearsal_env.sh).
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
    say "STOP: $PY is $("$PY" --version 2>&1), the pack's wheels are for 3.12 (PYTHON=\$(benchmarks/gpu_rehearsal_env.sh /tmp/dev312))"
    exit 3
fi

# shellcheck source=../scripts/gpu.sh
source scripts/gpu.sh
CMAKE_BACKEND=()
if [ "$MODE" = gpu ]; then
    if ! llamaserve_gpu_visible; then
        say "STOP: nvidia-smi lists no GPU (see machine.txt)"
        exit 2
    fi
    NVCC="$(llamaserve_nvcc)"
    if [ -z "$NVCC" ]; then
        say "STOP: no nvcc: cannot compile CUDA kernels"
        exit 2
    fi
    say "GPU: $(timeout 20 nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader | head -n 1)"
    # One GPU: no NCCL; one architecture: nothing to gain from compressing the fat binary.
    CMAKE_BACKEND=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" -DCMAKE_CUDA_COMPILER="$NVCC"
        -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_COMPRESSION_MODE=none)
    # cuBLAS and the driver library, which a toolkit installed in parts may lack: then cuBLAS from the
    # nvidia-cublas wheel beside the interpreter (torch's; headers and .so.13 files only) and
    # libcuda from the driver. A folder of links gives CMake the names it looks for, and none of the
    # wheel folder's other headers, which may not match this nvcc.
    SHIM="$WORK/cuda-links"
    rm -rf "$SHIM"
    mkdir -p "$SHIM/include" "$SHIM/lib"
    roots=("$(cd "$(dirname "$(readlink -f "$NVCC")")/.." && pwd)" "${CUDA_HOME:-/usr/local/cuda}" /usr/local/cuda /usr/local/cuda-*)
    has() { # has FILE...: one of the toolkit folders holds one of them
        local r f
        for r in "${roots[@]}"; do
            for f in "$@"; do
                ls "$r"/$f >/dev/null 2>&1 && return 0
            done
        done
        return 1
    }
    linked=0
    if ! has include/cublas_v2.h 'targets/*/include/cublas_v2.h'; then
        hdr=""
        for sp in $("$PY" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
            hdr="$(find "$sp/nvidia" -maxdepth 3 -name cublas_v2.h 2>/dev/null | head -n 1)"
            [ -n "$hdr" ] && break
        done
        if [ -n "$hdr" ]; then
            inc="$(dirname "$hdr")"
            ln -s "$inc"/cublas*.h "$SHIM/include/"
            for l in libcublas libcublasLt; do
                for f in "$(dirname "$inc")/lib/$l".so.*; do
                    [ -e "$f" ] || continue
                    ln -sf "$f" "$SHIM/lib/"
                    ln -sf "$f" "$SHIM/lib/$l.so"
                done
            done
            CMAKE_BACKEND+=(-DCMAKE_CUDA_FLAGS="-I$SHIM/include")
            linked=1
            say "cuBLAS: not in the toolkit (${roots[0]}); from the wheel at $(dirname "$inc")"
        else
            say "cuBLAS: neither in the toolkit (${roots[0]}) nor in a nvidia-cublas wheel: the build will fail"
        fi
    fi
    if ! has lib64/stubs/libcuda.so 'targets/*/lib/stubs/libcuda.so' lib64/libcuda.so; then
        drv="$( (ldconfig -p 2>/dev/null | sed -n 's/.*libcuda\.so\(\.1\)\? .*=> //p'
            ls /usr/local/nvidia/lib64/libcuda.so* /usr/lib/x86_64-linux-gnu/libcuda.so* /usr/lib64/libcuda.so* \
                2>/dev/null) | head -n 1)"
        if [ -n "$drv" ]; then
            ln -sf "$drv" "$SHIM/lib/libcuda.so"
            linked=1
            say "libcuda: no stub in the toolkit; linking against the driver's $drv"
        else
            # ggml links libcuda only for its virtual-memory pool; without it, both servers alike
            # use the plain CUDA allocator.
            CMAKE_BACKEND+=(-DGGML_CUDA_NO_VMM=ON)
            say "libcuda: neither a stub nor the driver's library found: GGML_CUDA_NO_VMM=ON"
        fi
    fi
    if [ "$linked" = 1 ]; then
        CMAKE_BACKEND+=(-DCMAKE_LIBRARY_PATH="$SHIM/lib")
        export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$SHIM/lib"
    fi
    SHAPES="${GPU_CHECK_SHAPES:-1b 8b}"
    # Both servers alike: every layer on the GPU, flash attention, 64 sequences in one unified KV.
    SERVER_ARGS="-ngl 99 -fa on -np 64 -c 32768 -kvu -t 8 -tb 8"
    BENCH_ARGS=(--max-tokens 128 --concurrency 16,64 --requests-per-client 1 --decode-runs 3 --pp-runs 3
        --pp-tokens 4000)
    BENCH_LIMIT=150
    BENCH_MIN=70
    CEILING_LIMIT=90
else
    SHAPES="${GPU_CHECK_SHAPES:-tiny1 tiny2}"
    SERVER_ARGS="-ngl 99 -fa on -np 4 -c 4096 -kvu -t 2 -tb 2"
    BENCH_ARGS=(--max-tokens 16 --concurrency 2,4 --requests-per-client 1 --decode-runs 2 --pp-runs 2
        --pp-tokens 512)
    BENCH_LIMIT=600
    BENCH_MIN=120
    CEILING_LIMIT=300
fi

# ---------------------------------------------------------------- 1. Python packages
SITE="$WORK/site"
if step wheels 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$PACK"/whl/*.whl; then
    :
else
    FAILED=1
fi
# llama-cpp-python's package, its lib/ a link to the build's libraries: LLAMA_CPP_LIB_PATH (below) is
# where llama_cpp and llamaserve's devices.py load them from, but llamaserve/llama/control_vectors.py
# opens llama_cpp/lib/libggml-base.so whatever it says. Through the link both are the same files, so
# the process loads each library once.
PYPKG="$WORK/py"
rm -rf "$PYPKG"
mkdir -p "$PYPKG"
cp -r "$PACK/py/llama_cpp" "$PYPKG/"
ln -s "$WORK/build/bin" "$PYPKG/llama_cpp/lib"
export PYTHONPATH="$SITE:$PYPKG:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Bytecode for everything ours imports, written once here: with PYTHONDONTWRITEBYTECODE set (as
# in these sandboxes) every server start would otherwise compile it all again, and the start-up
# row would measure the compiler (1.6 s against 0.8 s in the rehearsal).
step bytecode 120 "$PY" -m compileall -q -j "$JOBS" "$SITE" "$PYPKG" "$ROOT/llamaserve" "$ROOT/benchmarks" || FAILED=1

# ---------------------------------------------------------------- 2. build and models, side by side
SRC="$WORK/src"
BUILD="$WORK/build"
LIB="$BUILD/bin"
CPP_SERVER="$BUILD/bin/llama-server"
# The CPU side is compiled for this CPU less AMX: some VMs list AMX in CPUID and fault on its first
# instruction (benchmarks/amx_probe.c); with -ngl 99 the CPU kernels barely run anyway.
NO_AMX=""
[ "$(uname -m)" = x86_64 ] && NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_FLAGS=(
    -G "$GENERATOR"
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=ON
    -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON
    -DGGML_NATIVE=ON
    -DLLAMA_BUILD_COMMON=ON
    -DLLAMA_BUILD_TOOLS=ON
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_CURL=OFF
    "-DCMAKE_C_FLAGS=$NO_AMX"
    "-DCMAKE_CXX_FLAGS=$NO_AMX"
    "${CMAKE_BACKEND[@]}"
)
# Run by `step` (through timeout, so as a script of its own): $1 pack, $2 sources, $3 build folder,
# $4 jobs, then cmake's flags.
# shellcheck disable=SC2016  # expanded by the inner shell
BUILD_LLAMA='
set -e
PACK=$1 SRC=$2 BUILD=$3 JOBS=$4
shift 4
stamp="$(cksum <"$PACK/llama.cpp.tar.xz")"
# Extracted once per pack: a second run on the same machine rebuilds nothing.
if [ "$(cat "$SRC/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$SRC" "$BUILD"
    mkdir -p "$SRC"
    tar -xJf "$PACK/llama.cpp.tar.xz" -C "$SRC"
    echo "$stamp" >"$SRC/.stamp"
fi
echo "cmake $*"
cmake -S "$SRC/llama.cpp" -B "$BUILD" "$@"
t0=$(date +%s)
cmake --build "$BUILD" -j "$JOBS" --target llama mtmd llama-server
echo "compiled in $(($(date +%s) - t0))s"
"$BUILD/bin/llama-server" --version 2>&1
'
MODELS="$WORK/models"
# $1 shapes, $2 python, $3 pack, $4 models folder
# shellcheck disable=SC2016
WRITE_MODELS='
set -e
mkdir -p "$4"
for s in $1; do
    "$2" benchmarks/gpu_models.py write --shape "$s" --tokenizer "$3/tokenizer.json.gz" --out "$4/$s.gguf"
done
'

step build $((BUDGET - 100)) bash -c "$BUILD_LLAMA" _ "$PACK" "$SRC" "$BUILD" "$JOBS" "${CMAKE_FLAGS[@]}" &
BUILD_PID=$!
step models 240 bash -c "$WRITE_MODELS" _ "$SHAPES" "$PY" "$PACK" "$MODELS" &
MODELS_PID=$!
wait "$MODELS_PID" || FAILED=1
if ! wait "$BUILD_PID"; then
    say "STOP: no llama.cpp build, nothing to compare"
    exit 1
fi
grep -E "^compiled in|^version" "$LOGS/build.log" | sed 's/^/    /' | tee -a "$OUT/summary.txt" >&2

export LLAMA_CPP_LIB_PATH="$LIB" MTMD_CPP_LIB="$LIB"
if step version 60 "$PY" -c 'import sys; from llamaserve.unified_cli import llama_main; sys.exit(llama_main(["version"]))'; then
    if [ "$MODE" = gpu ] && ! grep -q "GPU offload: yes" "$LOGS/version.log"; then
        say "FAIL: llama-cpp-python's libllama has no GPU offload (see version.log): ours would run on the CPU"
        FAILED=1
    fi
else
    FAILED=1
fi

# ---------------------------------------------------------------- 3. the benchmark, shape by shape
RESULTS=()
set -- $SHAPES
n_left=$#
for s in "$@"; do
    model="$MODELS/$s.gguf"
    if [ ! -f "$model" ]; then
        say "bench-$s: no model"
        FAILED=1
        n_left=$((n_left - 1))
        continue
    fi
    # A shape gets up to BENCH_LIMIT seconds, less what the shapes after it need at least
    # (BENCH_MIN each) if that much is left; the serving ceiling's time and 20 s for the summary
    # stay. The first shape comes first.
    RESERVE=$((20 + CEILING_LIMIT))
    later=$(((n_left - 1) * BENCH_MIN))
    limit=$(($(left) - RESERVE - later))
    [ "$limit" -lt "$BENCH_MIN" ] && limit=$(($(left) - RESERVE))
    [ "$limit" -gt "$BENCH_LIMIT" ] && limit="$BENCH_LIMIT"
    dir="$WORK/bench-$s"
    rm -rf "$dir"
    if ! step "bench-$s" "$limit" "$PY" benchmarks/serve_bench.py --model "$model" "${BENCH_ARGS[@]}" \
        --warmup 1 --startup-timeout 90 --stop-timeout 10 --request-timeout 120 --cooldown 0.5 \
        --results-dir "$dir" \
        --name ours --server "{python} -m llamaserve -m {model} --port {port} $SERVER_ARGS" \
        --name cpp --server "$CPP_SERVER -m {model} --port {port} $SERVER_ARGS"; then
        FAILED=1
    fi
    for f in "$dir"/*.log; do
        [ -f "$f" ] && cp "$f" "$LOGS/$s-$(basename "$f")"
    done
    j="$(ls "$dir"/serve_bench-*.json 2>/dev/null | head -n 1)"
    [ -n "$j" ] && RESULTS+=("$s=$j")
    n_left=$((n_left - 1))
done

# ---------------------------------------------------------------- 4. the serving ceiling
# The sleeping runner loads the first shape for its vocabulary and template; its KV cache is
# made as usual (-ngl 99: on the GPU), but no step decodes.
RESERVE=20
set -- $SHAPES
if [ -f "$MODELS/$1.gguf" ]; then
    if step ceiling "$CEILING_LIMIT" "$PY" benchmarks/serving_ceiling.py --seconds 2 \
        --json "$WORK/ceiling.json" -- -m "$MODELS/$1.gguf" -ngl 99; then
        { echo "Serving ceiling (our server over a sleeping runner, $1's vocabulary, $(nproc) cores):"
            sed -n '/^| streams/,$p' "$LOGS/ceiling.log"
            echo; echo '```json'; cat "$WORK/ceiling.json"; echo '```'; } >"$OUT/ceiling.md"
        sed -n '/^| streams/,$p' "$LOGS/ceiling.log" | tee -a "$OUT/summary.txt" >&2
    else
        FAILED=1
    fi
else
    say "ceiling: no model"
fi

# ---------------------------------------------------------------- 5. the summary
RESERVE=0
if [ "${#RESULTS[@]}" -gt 0 ]; then
    "$PY" benchmarks/gpu_summary.py --mode "$MODE" --server-args "$SERVER_ARGS" --out "$OUT" "${RESULTS[@]}" \
        >"$LOGS/summary.log" 2>&1 || FAILED=1
else
    echo "no results" >"$LOGS/summary.log"
    FAILED=1
fi
say "done in $(elapsed)s: $([ "$FAILED" = 0 ] && echo "every step ran" || echo "some steps failed")"
cat "$LOGS/summary.log" | tee -a "$OUT/summary.txt"
exit "$FAILED"
