"""--control-vector steers generation the way llama-server's does: the vectors are added to every layer's output."""

from __future__ import annotations

from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest

from tests.server.conftest import start_server, stop_server

N_EMBD = 576  # SmolLM2-135M
N_LAYER = 30
BODY = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0.0}


def write_control_vector(path: Path, seed: int, size: float) -> None:
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", "llama")
    writer.add_uint32("controlvector.layer_count", N_LAYER - 1)
    rng = np.random.default_rng(seed)
    for layer in range(1, N_LAYER):
        writer.add_tensor(f"direction.{layer}", rng.standard_normal(N_EMBD).astype(np.float32) * size)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def complete(args: list[str], tmp: Path) -> str:
    server = start_server(args, tmp)
    try:
        r = httpx.post(f"{server.url}/completion", json=BODY, timeout=60)
        assert r.status_code == 200, r.text
        return str(r.json()["content"])
    finally:
        stop_server(server)


def test_control_vectors_change_the_answer_and_scale_zero_does_not(model_path: str, tmp_path: Path) -> None:
    vector = tmp_path / "push.gguf"
    write_control_vector(vector, seed=1, size=1.5)
    base = ["-m", model_path, "-c", "512", "-np", "1", "-t", "2"]
    plain = complete(base, tmp_path)
    steered = complete([*base, "--control-vector", str(vector)], tmp_path)
    zero = complete([*base, "--control-vector-scaled", f"{vector}:0"], tmp_path)
    assert steered != plain
    assert zero == plain
    # The same vector on the last layer only is a different intervention from all layers.
    ranged = complete([*base, "--control-vector", str(vector), "--control-vector-layer-range", "29", "29"], tmp_path)
    assert ranged != steered


def test_a_control_vector_of_the_wrong_width_stops_the_start(model_path: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    writer = gguf.GGUFWriter(str(bad), "controlvector")
    writer.add_tensor("direction.1", np.ones(7, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(RuntimeError, match="control vector"):
        start_server(["-m", model_path, "-c", "512", "--control-vector", str(bad)], tmp_path)
