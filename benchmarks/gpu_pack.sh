#!/usr/bin/env bash
# Packs everything benchmarks/gpu_check.sh needs on a GPU machine with no network into one
# git-ignored folder (default .gpucheck/, added to .git/info/exclude), to be named in the
# device call's `carry`:
#
#   llama.cpp.tar.xz     the llama.cpp tree vendored in the llama-cpp-python sdist, trimmed to what
#                        building libllama, its ggml libraries (CPU and CUDA backends), libmtmd and
#                        llama-server needs (no docs, models, tests, examples, other backends, web UI
#                        sources: the server is built without an embedded UI, as build_cpp_server.sh does)
#   py/llama_cpp/        llama-cpp-python's pure-Python package from the same sdist (no compiled
#                        library: it loads the one gpu_check.sh builds, through LLAMA_CPP_LIB_PATH)
#   whl/                 cp312 manylinux wheels of what llamaserve and gguf need that the device's
#                        image (KINDS.md's package list) lacks or may hold too old, one version each
#   tokenizer.json.gz    SmolLM2's BPE vocabulary, merges and chat template, read from its GGUF
#                        (benchmarks/gpu_models.py pads it to Llama-3's 128,256 entries there)
#
#   benchmarks/gpu_pack.sh            # prints the folder's size last
#
# Environment: GPU_PACK_DIR (default .gpucheck), PYTHON (runs pip and gguf; default .venv/bin/python),
# FORCE=1 (pack again from scratch).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PACK="${GPU_PACK_DIR:-$ROOT/.gpucheck}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
VER=0.3.36

log() { echo "[gpu_pack] $*" >&2; }

# Ignored locally (not in .gitignore: the folder is this script's output, on this checkout alone).
EXCLUDE="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$EXCLUDE")"
if [[ "$PACK" == "$ROOT/.gpucheck" ]] && ! grep -qx '/.gpucheck/' "$EXCLUDE" 2>/dev/null; then
    echo '/.gpucheck/' >>"$EXCLUDE"
fi
[[ "${FORCE:-0}" == 1 ]] && rm -rf "$PACK"
mkdir -p "$PACK"

# ------------------------------------------------------------------ llama.cpp sources
SDIST="$ROOT/benchmarks/.cpp-server/src/llama_cpp_python-$VER.tar.gz"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
if [[ ! -f "$SDIST" ]]; then
    log "downloading the llama-cpp-python==$VER sdist"
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$WORK"
    SDIST="$WORK/llama_cpp_python-$VER.tar.gz"
fi
if [[ ! -f "$PACK/llama.cpp.tar.xz" || ! -d "$PACK/py/llama_cpp" ]]; then
    log "extracting $SDIST"
    tar -xzf "$SDIST" -C "$WORK"
    TREE="$WORK/llama_cpp_python-$VER"
    EXCLUDES=(
        docs models media gguf-py benches tests examples conversion skills requirements
        .github .devops 'tools/ui/src' 'tools/ui/tests' 'tools/ui/static'
        'ggml/src/ggml-vulkan' 'ggml/src/ggml-sycl' 'ggml/src/ggml-opencl' 'ggml/src/ggml-metal'
        'ggml/src/ggml-cann' 'ggml/src/ggml-hexagon' 'ggml/src/ggml-et' 'ggml/src/ggml-openvino'
        'ggml/src/ggml-webgpu' 'ggml/src/ggml-virtgpu' 'ggml/src/ggml-zdnn' 'ggml/src/ggml-musa'
        'ggml/src/ggml-hip' 'ggml/src/ggml-zendnn'
    )
    TAR_EX=()
    for e in "${EXCLUDES[@]}"; do TAR_EX+=("--exclude=llama.cpp/$e"); done
    log "packing the trimmed llama.cpp tree"
    tar -C "$TREE/vendor" "${TAR_EX[@]}" --exclude='*.gguf' --exclude='__pycache__' \
        -cJf "$PACK/llama.cpp.tar.xz.tmp" llama.cpp
    mv -f "$PACK/llama.cpp.tar.xz.tmp" "$PACK/llama.cpp.tar.xz"
    rm -rf "$PACK/py"
    mkdir -p "$PACK/py"
    cp -r "$TREE/llama_cpp" "$PACK/py/llama_cpp"
    rm -rf "$PACK/py/llama_cpp/server" "$PACK/py/llama_cpp/lib"
    find "$PACK/py" -name __pycache__ -prune -exec rm -rf {} +
    echo "$VER" >"$PACK/py/VERSION"
fi

# ------------------------------------------------------------------ wheels for Python 3.12
# What llamaserve (pyproject's dependencies, uvicorn[standard] and mcp with theirs) and gguf need,
# less what the device's image holds (numpy, pyyaml, requests, tqdm, urllib3, certifi, attrs,
# markupsafe, click, uvloop, regex). anyio, idna, h11, httpx, httpcore, jinja2, typing-extensions
# and prometheus-client are there too but in versions nobody has read: carried so that mcp's and
# httpx2's lower bounds hold. The versions are the project .venv's.
WHEELS=(
    fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
    annotated-doc==0.0.7 typing-inspection==0.4.5 typing-extensions==4.16.0
    uvicorn==0.54.0 httptools==0.9.0 websockets==17.4 watchfiles==1.3.0 python-dotenv==1.2.4
    mcp==2.3.0 mcp-types==2.3.0 sse-starlette==3.7.1 jsonschema==4.26.0 jsonschema-specifications==2025.9.1
    referencing==0.37.0 rpds-py==2026.9.1 pyjwt==2.15.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
    opentelemetry-api==1.45.2 python-multipart==0.0.34 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
    anyio==4.16.0 idna==3.20 h11==0.16.0 httpx==0.29.0 httpcore==1.0.9 jinja2==3.1.6 prometheus-client==0.26.0
    gguf==0.19.0 diskcache==5.6.3
)
if [[ ! -f "$PACK/whl/.complete" ]]; then
    log "downloading ${#WHEELS[@]} cp312 wheels"
    rm -rf "$PACK/whl"
    mkdir -p "$PACK/whl"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$PACK/whl" "${WHEELS[@]}" 2>&1 |
        grep -v '^WARNING: Location' >&2 || true
    n="$(find "$PACK/whl" -name '*.whl' | wc -l)"
    if [[ "$n" -ne "${#WHEELS[@]}" ]]; then
        log "expected ${#WHEELS[@]} wheels, got $n"
        exit 1
    fi
    touch "$PACK/whl/.complete"
fi

# ------------------------------------------------------------------ the tokenizer
if [[ ! -f "$PACK/tokenizer.json.gz" ]]; then
    log "reading SmolLM2's tokenizer"
    "$PYTHON" benchmarks/gpu_models.py tokenizer --out "$PACK/tokenizer.json.gz"
fi

du -sh "$PACK" | awk '{print "packed: " $1 " in " $2}'
