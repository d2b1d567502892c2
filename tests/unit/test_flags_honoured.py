"""Flags that used to parse and reach nothing: each now acts, or is refused or warned about
naming itself (--fit/-fitt/-fitc, -bs, --spec-draft-p-split, the --vision-gemma-* presets)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from llamaserve import compose, model_load
from llamaserve.cli import config_from_args
from llamaserve.config import ConfigError


@pytest.fixture()
def model_file(tmp_path: Path) -> str:
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF")
    return str(p)


@pytest.mark.parametrize(
    ("argv", "env"),
    [(["-bs"], {}), (["--backend-sampling"], {}), ([], {"LLAMA_ARG_BACKEND_SAMPLING": "1"})],
)
def test_backend_sampling_is_refused_naming_it(argv: list[str], env: dict[str, str], model_file: str) -> None:
    with pytest.raises(ConfigError, match=r"backend sampling .*not part of llamaserve yet"):
        config_from_args(["-m", model_file, *argv], environ=env)


def test_draft_p_split_warns_that_llama_cpp_reads_it_nowhere(
    model_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config_from_args(["-m", model_file, "--spec-draft-p-split", "0.3"], environ={})
    assert cfg.spec.draft_p_split == 0.3
    assert "--spec-draft-p-split has no effect: llama.cpp" in capsys.readouterr().err


def test_vision_gemma_presets_are_an_hf_model_like_any_other(tmp_path: Path) -> None:
    """Offline with an empty cache, the preset fails exactly as `-hf` of its repo does."""
    env = {"LLAMA_CACHE": str(tmp_path / "cache"), "HF_ENDPOINT": "http://127.0.0.1:9"}
    for preset, repo in (
        ("--vision-gemma-4b-default", "ggml-org/gemma-3-4b-it-qat-GGUF"),
        ("--vision-gemma-12b-default", "ggml-org/gemma-3-12b-it-qat-GGUF"),
    ):
        with pytest.raises(ConfigError) as by_preset:
            config_from_args([preset, "--offline"], environ=env)
        with pytest.raises(ConfigError) as by_hf:
            config_from_args(["-hf", repo, "--offline", "--port", "8014", "-c", "0", "--jinja"], environ=env)
        assert str(by_preset.value) == str(by_hf.value)
        assert repo in str(by_preset.value) and "--offline" in str(by_preset.value)


def test_fit_on_a_cpu_build_has_nothing_to_fit(
    model_file: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(compose, "gpu_offload_supported", lambda: False)
    monkeypatch.setattr(model_load, "gpu_offload_supported", lambda: False)
    cfg = config_from_args(["-m", model_file, "--fit", "on", "-fitt", "512", "-fitc", "2048"], environ={})
    assert (cfg.load.fit, cfg.load.fit_target, cfg.load.fit_ctx) == (True, (512,), 2048)
    with caplog.at_level(logging.WARNING, logger="llamaserve"):
        model_load.check_fit(cfg)  # as llama-server without a GPU: nothing happens
        compose._announce_hardware_flags(cfg)
    assert "-fitt" in caplog.text and "no GPU backend" in caplog.text


def test_fit_asked_on_a_gpu_build_is_refused_naming_it(model_file: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_load, "gpu_offload_supported", lambda: True)
    for argv, named in ((["--fit", "on"], "--fit"), (["-fitt", "2048"], "-fitt"), (["-fitc", "8192"], "-fitc")):
        cfg = config_from_args(["-m", model_file, *argv], environ={})
        with pytest.raises(ConfigError, match=f"^{named}: fitting the model into device memory .*--fit off"):
            model_load.check_fit(cfg)
    cfg = config_from_args(["-m", model_file], environ={"LLAMA_ARG_FIT_CTX": "8192"})
    with pytest.raises(ConfigError, match="-fitc 8192"):
        model_load.check_fit(cfg)


def test_fit_by_default_on_a_gpu_build_says_it_does_not_happen(
    model_file: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(model_load, "gpu_offload_supported", lambda: True)
    with caplog.at_level(logging.WARNING, logger="llamaserve"):
        model_load.check_fit(config_from_args(["-m", model_file, "-ngl", "20", "-c", "4096"], environ={}))
    assert "llamaserve does not" in caplog.text and "-ngl 20 and -c 4096" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="llamaserve"):
        model_load.check_fit(config_from_args(["-m", model_file, "--fit", "off"], environ={}))
    assert caplog.text == ""
