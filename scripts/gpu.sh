# shellcheck shell=bash
# Sourced by scripts/bootstrap and benchmarks/build_cpp_server.sh: whether llama.cpp is built
# with CUDA, and with which cmake flags. Both ask the same question so that llama-cpp-python
# and the C++ llama-server run the same backend.
#
#   LLAMASERVE_CUDA=1   CUDA build (fails in cmake if the toolkit is missing)
#   LLAMASERVE_CUDA=0   CPU build, whatever the machine has
#   unset / auto        CUDA when nvidia-smi lists a GPU and nvcc is installed, else CPU
#   CUDA_ARCHITECTURES  e.g. "90" or "80;90"; default: the visible GPUs' own, else ggml's list

# nvidia-smi can hang on a wedged driver: never wait on it long.
_llamaserve_smi() {
    command -v nvidia-smi >/dev/null 2>&1 || return 1
    if command -v timeout >/dev/null 2>&1; then timeout 20 nvidia-smi "$@"; else nvidia-smi "$@"; fi
}

llamaserve_gpu_visible() {
    _llamaserve_smi -L 2>/dev/null | grep -q '^GPU '
}

# The CUDA compiler: on PATH, or in the toolkit (CUDA_HOME, by default where it installs).
llamaserve_nvcc() {
    if command -v nvcc >/dev/null 2>&1; then
        command -v nvcc
    elif [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
        echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
    fi
}

llamaserve_want_cuda() {
    case "${LLAMASERVE_CUDA:-auto}" in
    1 | on | yes | true) return 0 ;;
    0 | off | no | false) return 1 ;;
    auto | "") ;;
    *)
        echo "LLAMASERVE_CUDA must be 1, 0 or auto, got '${LLAMASERVE_CUDA}'" >&2
        exit 1
        ;;
    esac
    llamaserve_gpu_visible || return 1
    if [ -z "$(llamaserve_nvcc)" ]; then
        # A driver without the toolkit (common on inference hosts) cannot compile CUDA kernels.
        echo "note: a GPU is visible but nvcc is not: building for the CPU (install the CUDA toolkit," \
            "or set LLAMASERVE_CUDA=1 to insist)" >&2
        return 1
    fi
}

# Compute capabilities of the visible GPUs as cmake wants them ("9.0" -> "90"), deduplicated.
# Compiling for these alone is several times faster than ggml's default list of generations.
llamaserve_gpu_archs() {
    _llamaserve_smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
        tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd ';' -
}

llamaserve_cuda_cmake_args() {
    local arch="${CUDA_ARCHITECTURES:-}"
    [ -n "$arch" ] || arch="$(llamaserve_gpu_archs || true)"
    echo "-DGGML_CUDA=on${arch:+ -DCMAKE_CUDA_ARCHITECTURES=$arch}"
}
