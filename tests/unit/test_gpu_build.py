"""Which llama.cpp build scripts/bootstrap and benchmarks/build_cpp_server.sh choose (scripts/gpu.sh).

Run through `scripts/bootstrap --dry-run`, which decides and prints but installs nothing,
with a stand-in `nvidia-smi` and `nvcc` on PATH: a CPU machine must get exactly
today's build, a GPU machine with the toolkit the CUDA one.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AMX_OFF = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _tool(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def dry_run(tmp_path: Path, *, gpu: bool, nvcc: bool, cuda: str | None = None) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    if gpu:
        _tool(
            bindir,
            "nvidia-smi",
            'case "$*" in *compute_cap*) echo "9.0";; *) echo "GPU 0: NVIDIA H200 (UUID: GPU-0)";; esac',
        )
    if nvcc:
        _tool(bindir, "nvcc", "echo nvcc")
    # Only the stand-ins and the system's own tools: no real toolkit on PATH or in CUDA_HOME.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMASERVE_", "CUDA"))}
    env["PATH"] = f"{bindir}:/usr/bin:/bin"
    env["CUDA_HOME"] = str(tmp_path / "no-toolkit")
    if cuda is not None:
        env["LLAMASERVE_CUDA"] = cuda
    return subprocess.run(
        ["bash", "scripts/bootstrap", "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_cpu_machine_gets_todays_build(tmp_path: Path) -> None:
    run = dry_run(tmp_path, gpu=False, nvcc=False)
    assert run.returncode == 0, run.stderr
    assert "llama.cpp backend: cpu" in run.stdout
    assert "GGML_CUDA" not in run.stdout and "CMAKE_ARGS" not in run.stdout
    if platform.machine() == "x86_64":
        assert f"CFLAGS={AMX_OFF} CXXFLAGS={AMX_OFF}" in run.stdout


def test_a_visible_gpu_with_the_toolkit_gets_cuda_for_its_architecture(tmp_path: Path) -> None:
    run = dry_run(tmp_path, gpu=True, nvcc=True)
    assert run.returncode == 0, run.stderr
    assert "llama.cpp backend: cuda" in run.stdout
    assert "CMAKE_ARGS=-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90" in run.stdout
    # The C++ server is built the same way.
    assert "C++ llama-server: backend cuda: cmake" in run.stdout
    assert run.stdout.count("-DCMAKE_CUDA_ARCHITECTURES=90") == 2


def test_a_gpu_without_nvcc_stays_on_the_cpu_and_says_why(tmp_path: Path) -> None:
    run = dry_run(tmp_path, gpu=True, nvcc=False)
    assert run.returncode == 0, run.stderr
    assert "llama.cpp backend: cpu" in run.stdout
    assert "nvcc is not" in run.stderr


@pytest.mark.parametrize(("cuda", "gpu", "backend"), [("0", True, "cpu"), ("1", False, "cuda"), ("auto", False, "cpu")])
def test_the_variable_forces_either_build(tmp_path: Path, cuda: str, gpu: bool, backend: str) -> None:
    run = dry_run(tmp_path, gpu=gpu, nvcc=True, cuda=cuda)
    assert run.returncode == 0, run.stderr
    assert f"llama.cpp backend: {backend}" in run.stdout
    if backend == "cuda":
        assert "CMAKE_ARGS=-DGGML_CUDA=on" in run.stdout
        assert "CMAKE_CUDA_ARCHITECTURES" not in run.stdout  # no GPU to ask: ggml's own list


def test_a_bad_value_is_refused(tmp_path: Path) -> None:
    run = dry_run(tmp_path, gpu=False, nvcc=False, cuda="maybe")
    assert run.returncode == 1
    assert "LLAMASERVE_CUDA must be 1, 0 or auto" in run.stderr
