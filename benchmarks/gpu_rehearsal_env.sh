#!/usr/bin/env bash
# A Python 3.12 virtual environment that stands in for the GPU machine's interpreter, so that the
# CPU rehearsal of benchmarks/gpu_check.sh installs the very cp312 wheels the device call will:
# Python 3.12 with only the packages of the device image that llamaserve, gguf and the benchmarks
# import (KINDS.md's "Python packages already there"), none of the carried ones.
#
#   benchmarks/gpu_rehearsal_env.sh /tmp/dev312       # prints the interpreter's path last
#   PYTHON=/tmp/dev312/bin/python GPU_CHECK_MODE=cpu OUT=/tmp/gc benchmarks/gpu_check.sh
#
# Environment: PYTHON312 (default: pyenv's 3.12, else python3.12 on PATH).
set -euo pipefail
DEST="${1:?usage: gpu_rehearsal_env.sh FOLDER}"
PY312="${PYTHON312:-}"
if [[ -z "$PY312" ]]; then
    for candidate in "$(pyenv prefix 3.12 2>/dev/null)/bin/python" "$(command -v python3.12 || true)"; do
        if [[ -x "$candidate" ]]; then
            PY312="$candidate"
            break
        fi
    done
fi
if [[ -z "$PY312" ]] || ! "$PY312" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    echo "gpu_rehearsal_env: no Python 3.12 found (set PYTHON312)" >&2
    exit 1
fi
"$PY312" -m venv "$DEST"
# The device image's packages that our code or the build uses; the rest of that image (torch, jax,
# ...) nothing here imports.
"$DEST/bin/python" -m pip install --quiet --disable-pip-version-check \
    numpy pyyaml requests tqdm urllib3 certifi attrs markupsafe click uvloop regex cmake ninja packaging psutil 2>&1 |
    grep -v '^WARNING: Location' >&2 || true
echo "$DEST/bin/python"
