"""Flags and LLAMA_ARG_* variables map to the config as llama-server's do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llamaserve.cli import config_from_args
from llamaserve.config import ConfigError


@pytest.fixture()
def model_file(tmp_path: Path) -> str:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")
    return str(p)


def test_flags_map_to_config(model_file: str) -> None:
    cfg = config_from_args(
        [
            "-m",
            model_file,
            "-c",
            "4096",
            "-np",
            "8",
            "-b",
            "512",
            "-ub",
            "256",
            "-t",
            "2",
            "-tb",
            "3",
            "--host",
            "0.0.0.0",
            "--port",
            "9000",
            "-a",
            "one,two",
            "-n",
            "64",
            "--temp",
            "0.2",
            "--top-k",
            "10",
            "--top-p",
            "0.5",
            "--min-p",
            "0.1",
            "--seed",
            "7",
            "--no-jinja",
            "-v",
            "--timeout",
            "30",
        ],
        environ={},
    )
    assert (cfg.ctx_size, cfg.n_parallel, cfg.batch_size, cfg.ubatch_size) == (4096, 8, 512, 256)
    assert (cfg.threads, cfg.threads_batch, cfg.host, cfg.port) == (2, 3, "0.0.0.0", 9000)
    assert cfg.alias == ("one", "two") and cfg.model_alias == "one"
    assert cfg.n_predict == 64 and cfg.jinja is False and cfg.verbose and cfg.timeout == 30
    s = cfg.sampling
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.seed) == (0.2, 10, 0.5, 0.1, 7)


def test_environment_variables_and_flag_precedence(model_file: str) -> None:
    env = {
        "LLAMA_ARG_MODEL": model_file,
        "LLAMA_ARG_CTX_SIZE": "2048",
        "LLAMA_ARG_N_PARALLEL": "3",
        "LLAMA_ARG_PORT": "8123",
        "LLAMA_ARG_TEMPERATURE": "0.3",
        "LLAMA_ARG_JINJA": "off",
        "LLAMA_ARG_ENDPOINT_METRICS": "1",
        "LLAMA_API_KEY": "k1,k2",
        "LLAMA_ARG_KV_UNIFIED": "true",
    }
    cfg = config_from_args([], environ=env)
    assert cfg.model == model_file and cfg.ctx_size == 2048 and cfg.n_parallel == 3 and cfg.port == 8123
    assert cfg.sampling.temperature == 0.3 and cfg.jinja is False and cfg.endpoint_metrics is True
    assert cfg.api_keys == ("k1", "k2") and cfg.effective_kv_unified is True
    cfg2 = config_from_args(["-c", "512", "--jinja"], environ=env)
    assert cfg2.ctx_size == 512 and cfg2.jinja is True


def test_parallel_auto_means_many_sequences_sharing_a_pool_sized_as_llama_server_sizes_it(model_file: str) -> None:
    cfg = config_from_args(["-m", model_file], environ={})
    assert cfg.effective_parallel == 32 and cfg.effective_kv_unified is True
    cfg = config_from_args(["-m", model_file, "--kv-unified-per-slot", "1024"], environ={})
    assert cfg.pool_slots == 4  # the pool llama-server would size: 4 x 1024 cells
    cfg = config_from_args(["-m", model_file, "-np", "2"], environ={})
    assert cfg.effective_parallel == 2 and cfg.pool_slots == 2 and cfg.effective_kv_unified is False


def test_aliases_are_a_sorted_set_whose_first_names_the_model(model_file: str) -> None:
    cfg = config_from_args(["-m", model_file, "-a", "tinyllama-2,fim,code,fim"], environ={})
    assert cfg.alias == ("code", "fim", "tinyllama-2") and cfg.model_alias == "code"


def test_samplers_flag(model_file: str) -> None:
    cfg = config_from_args(["-m", model_file, "--samplers", "top_k;temperature"], environ={})
    assert cfg.sampling.samplers == ("top_k", "temperature")
    cfg = config_from_args(["-m", model_file, "--sampling-seq", "kt"], environ={})
    assert cfg.sampling.samplers == ("top_k", "temperature")
    with pytest.raises(ConfigError):
        config_from_args(["-m", model_file, "--samplers", "bogus"], environ={})


def test_bad_values_raise(model_file: str) -> None:
    with pytest.raises(ConfigError):
        config_from_args(["-m", "/nonexistent/model.gguf"], environ={})
    with pytest.raises(ConfigError):
        config_from_args(["-m", model_file, "-np", "0"], environ={})
    with pytest.raises(ConfigError):
        config_from_args(["-m", model_file], environ={"LLAMA_ARG_CTX_SIZE": "lots"})


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llamaserve", *args], capture_output=True, text=True, timeout=60)


def test_unknown_flag_exits_1_with_a_message() -> None:
    r = run_cli("--no-such-flag")
    assert r.returncode == 1
    assert "--no-such-flag" in r.stderr


def test_missing_model_exits_1_with_a_message() -> None:
    r = run_cli("-m", "/nonexistent/model.gguf")
    assert r.returncode == 1
    assert "model file not found" in r.stderr
