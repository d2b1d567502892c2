"""Every part of llamaserve that opens a llama.cpp library directly opens the one llama-cpp-python
loaded: with LLAMA_CPP_LIB_PATH (an RPC or GPU build beside the package's own) a second copy from
the package's folder would be another ggml, with its own tensor and device registries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# scripts/bootstrap builds llama.cpp a second time there (scripts/build_rpc.sh).
OTHER_BUILD = REPO / ".rpc" / "lib"

PROBE = """
import llamaserve.llama.control_vectors as cv, llamaserve.llama.devices as dv
print(cv._base._name)
print(dv._base._name)
"""


def test_control_vectors_and_devices_use_the_library_dir_llama_cpp_python_uses() -> None:
    if not (OTHER_BUILD / "libggml-base.so").exists():
        pytest.fail(f"{OTHER_BUILD} is missing: scripts/bootstrap builds it (scripts/build_rpc.sh)")
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(OTHER_BUILD)}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    paths = out.stdout.split()
    assert paths == [str(OTHER_BUILD / "libggml-base.so")] * 2, out.stdout + out.stderr
