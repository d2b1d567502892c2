#!/usr/bin/env bash
# The GPU check, run by hand on a lent GPU machine; CI never needs it.
#
#   OUT=/some/dir benchmarks/gpu_check.sh [build] [test] [bench]     (no stage: all three)
#
# build  scripts/bootstrap --core with LLAMASERVE_CUDA=1 (llama-cpp-python compiled with CUDA,
#        for the visible GPUs' architectures only), and benchmarks/build_cpp_server.sh with CUDA,
#        side by side; then `llama version` must say "GPU offload: yes".
# test   the generation tests of tests/server/ (completion and chat, OpenAI and native
#        routes) with every server started with "-ngl 99 -fa on".
# bench  benchmarks/serve_bench.py --quick: llamaserve and the C++ llama-server, both on the GPU.
#
# Everything it says goes under $OUT: summary.txt (one line per step, with its time and exit
# code), machine.txt, one log per step, tests.xml, bench/ (the JSON results and server logs).
# The whole run stays within GPU_CHECK_SECONDS (default 570, under a 10-minute command
# limit): each step is cut at what is left, and a step that had no time is reported as
# skipped. The builds land in .venv and benchmarks/.cpp-server, so a second call on the
# same machine (`... gpu_check.sh test bench`) starts from them.
#
# The machine may have no internet. pip is asked once, with a short timeout, whether its
# index answers; if not, and WHEELHOUSE does not name a folder of wheels and sdists to
# install from instead, the check stops there and says so (exit 3). No GPU or no nvcc:
# exit 2. A failed step: exit 1.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
: "${OUT:?set OUT to the folder that receives the logs and results}"
mkdir -p "$OUT"
BEGIN=$(date +%s)
BUDGET="${GPU_CHECK_SECONDS:-570}"
JOBS="$(nproc)"
FAILED=0

STAGES=("$@")
[ "${#STAGES[@]}" -gt 0 ] || STAGES=(build test bench)
wants() { [[ " ${STAGES[*]} " == *" $1 "* ]]; }

elapsed() { echo $(($(date +%s) - BEGIN)); }
say() { echo "[gpu_check +$(elapsed)s] $*" | tee -a "$OUT/summary.txt" >&2; }
left() { echo $((BUDGET - $(elapsed))); }

# step NAME LIMIT CMD...: CMD's output to $OUT/NAME.log, cut at LIMIT seconds or what is left.
step() {
    local name="$1" limit="$2" rc t0
    shift 2
    [ "$(left)" -lt "$limit" ] && limit="$(left)"
    if [ "$limit" -lt 20 ]; then
        say "$name: SKIPPED (no time left in the ${BUDGET}s budget)"
        return 124
    fi
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    local took=$(($(date +%s) - t0))
    if [ "$rc" -eq 0 ]; then
        say "$name: ok in ${took}s"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        say "$name: TIMED OUT after ${took}s (limit ${limit}s); tail of $name.log:"
        tail -n 15 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$OUT/summary.txt" >&2
    else
        say "$name: FAILED (exit $rc) in ${took}s; tail of $name.log:"
        tail -n 15 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$OUT/summary.txt" >&2
    fi
    return "$rc"
}

# ---------------------------------------------------------------- the machine
{
    echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, stages: ${STAGES[*]}"
    timeout 20 nvidia-smi 2>&1 || echo "nvidia-smi: not available"
    echo "== nvcc: $(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || echo none)"
    (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 | tail -n 2
    echo "== cmake: $(cmake --version 2>&1 | head -n 1)"
    echo "== python3: $(python3 --version 2>&1)"
    echo "== git HEAD: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    free -g 2>/dev/null
} >"$OUT/machine.txt" 2>&1
# shellcheck source=../scripts/gpu.sh
source scripts/gpu.sh
if ! llamaserve_gpu_visible; then
    say "STOP: nvidia-smi lists no GPU (see machine.txt)"
    exit 2
fi
say "GPU: $(timeout 20 nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader | head -n 1)"

# A tree copied from another machine can carry links into that machine's folders.
for link in .venv benchmarks/.cpp-server; do
    if [ -L "$link" ] && [ ! -e "$link" ]; then
        rm -f "$link"
    fi
done

# ---------------------------------------------------------------- build
if wants build; then
    if [ -L .venv ]; then
        # A venv shared with other trees would be rebuilt under them.
        say "STOP: .venv links to $(readlink .venv); the build stage rebuilds llama-cpp-python there. Run it in a" \
            "tree with its own .venv (or none), or run only the test and bench stages"
        exit 2
    fi
    if [ -z "$(llamaserve_nvcc)" ]; then
        say "STOP: no nvcc (not on PATH, not in ${CUDA_HOME:-/usr/local/cuda}/bin): cannot compile CUDA kernels"
        exit 2
    fi
    export PIP_DEFAULT_TIMEOUT=15 PIP_RETRIES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
    if [ -n "${WHEELHOUSE:-}" ]; then
        export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELHOUSE"
        say "pip: offline, from WHEELHOUSE=$WHEELHOUSE"
    else
        INDEX="${PIP_INDEX_URL:-https://pypi.org/simple}"
        if ! timeout 20 python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/pip/", timeout=8)' "$INDEX" 2>"$OUT/pip-probe.log"; then
            say "STOP: pip's index $INDEX does not answer ($(tail -n 1 "$OUT/pip-probe.log")); the CUDA build needs" \
                "llama-cpp-python's sdist, its build tools and llamaserve's dependencies from it." \
                "Set WHEELHOUSE to a folder holding them (pip download on a connected machine) to run offline."
            exit 3
        fi
        say "pip: $INDEX answers"
    fi
    export LLAMASERVE_CUDA=1 CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
    # The C++ build takes llama.cpp from the same sdist: from the wheelhouse when offline.
    mkdir -p benchmarks/.cpp-server/src
    for sdist in "${WHEELHOUSE:-/nonexistent}"/llama_cpp_python-*.tar.gz; do
        [ -f "$sdist" ] && cp -n "$sdist" benchmarks/.cpp-server/src/
    done
    # Side by side: each build is mostly one long serial stretch (ggml-cuda's kernels), so two
    # builds on all cores finish sooner than one after the other.
    step bootstrap 420 scripts/bootstrap --core &
    PY_BUILD=$!
    step cpp-build 420 env JOBS="$JOBS" NICE=0 PYTHON=python3 benchmarks/build_cpp_server.sh &
    CPP_BUILD=$!
    wait "$PY_BUILD" || FAILED=1
    wait "$CPP_BUILD" || FAILED=1
    [ -f benchmarks/.cpp-server/BUILD_INFO ] && cp benchmarks/.cpp-server/BUILD_INFO "$OUT/cpp-BUILD_INFO.txt"
fi

# The copied tree is what is tested, whichever tree the venv was installed from.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
    say "STOP: no .venv (the build stage did not make one)"
    exit 1
fi
if step version 60 "$PY" -m llamaserve.unified_cli version; then
    if grep -q "GPU offload: yes" "$OUT/version.log"; then
        say "llama-cpp-python: built with GPU offload"
    else
        say "FAIL: llama-cpp-python has no GPU offload (see version.log); the tests would run on the CPU"
        FAILED=1
    fi
fi

# ---------------------------------------------------------------- test
GPU_ARGS="-ngl 99 -fa on"
if wants test; then
    LLAMASERVE_TEST_SERVER_ARGS="$GPU_ARGS" step tests 180 "$PY" -m pytest -q -p no:cacheprovider \
        tests/server/test_openai_api.py tests/server/test_native_api.py -k "completion or chat" \
        --junitxml="$OUT/tests.xml" || FAILED=1
    grep -E "passed|failed|error" "$OUT/tests.log" | tail -n 1 | sed 's/^/    /' | tee -a "$OUT/summary.txt" >&2
fi

# ---------------------------------------------------------------- bench
if wants bench; then
    CPP=benchmarks/.cpp-server/llama-server
    BENCH=(--name ours --server "{python} -m llamaserve -m {model} --port {port} -np 8 -c 8192 $GPU_ARGS")
    if [ -x "$CPP" ] && grep -q '^backend: cuda' benchmarks/.cpp-server/BUILD_INFO 2>/dev/null; then
        BENCH+=(--name cpp --server "$CPP -m {model} --port {port} -np 8 -c 8192 $GPU_ARGS")
    else
        say "bench: no CUDA build of the C++ llama-server: llamaserve alone"
        FAILED=1
    fi
    step bench 170 "$PY" benchmarks/serve_bench.py --quick --startup-timeout 60 --results-dir "$OUT/bench" \
        "${BENCH[@]}" || FAILED=1
fi

say "done in $(elapsed)s: $([ "$FAILED" = 0 ] && echo "all steps passed" || echo "some steps failed")"
exit "$FAILED"
