"""Router mode's model-free parts: presets, the model list, a child's flags, merged metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaserve.cli import config_from_args
from llamaserve.config import ConfigError, ServerConfig
from llamaserve.edge.metrics import merge_metrics
from llamaserve.router.catalog import load_catalog
from llamaserve.router.preset import from_argv, parse_ini


def _gguf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def test_preset_keys_are_flags_short_flags_or_variables() -> None:
    glob, sections = parse_ini(
        "version = 1\n; comment\n[*]\nc = 4096\n\n[m]\nctx-size = 2048\nLLAMA_ARG_CACHE_RAM = 0\n"
        "no-mmap = true\njinja = false\nload-on-startup = 1\nstop-timeout = 3\n",
        "p.ini",
    )
    own = sections["m"].over(glob)
    argv = own.argv()
    assert argv[argv.index("-c") + 1] == "2048" and argv.count("-c") == 1  # the model's own over [*]
    assert sorted(argv) == sorted(["-c", "2048", "-cram", "0", "--no-mmap", "--no-jinja"])
    assert own.router == {"load-on-startup": "1", "stop-timeout": "3"}
    assert glob.argv() == ["-c", "4096"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[m]\nno-such-flag = 1\n", "no-such-flag"),
        ("[m]\nctx-size\n", "KEY = VALUE"),
        ("[m]\nmlock = maybe\n", "mlock"),
    ],
)
def test_a_bad_preset_line_is_refused_naming_it(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_ini(text, "p.ini")


def test_a_child_gets_the_routers_flags_except_its_own_and_the_model_ones() -> None:
    base = from_argv(
        ["--port", "9000", "--host", "0.0.0.0", "--api-key", "k", "--models-dir", "/m", "--models-max", "2"]
        + ["-m", "x.gguf", "--alias", "a", "-c", "1024", "--temp", "0", "--no-webui", "-r", "A", "-r", "B"]
    )
    assert base.argv() == ["-c", "1024", "--temp", "0", "--no-ui", "-r", "A", "-r", "B"]
    _, sections = parse_ini("[m]\nc = 512\n", "p.ini")
    # The model's preset over the router's command line.
    merged = sections["m"].over(base).argv()
    assert merged[merged.index("-c") + 1] == "512" and merged.count("-c") == 1


def test_merged_metrics_label_every_sample_with_its_model_and_keep_one_type_line() -> None:
    child = (
        "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
        "# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 7\n"
        '# TYPE llamaserve:ttft_seconds histogram\nllamaserve:ttft_seconds_bucket{le="0.1"} 1\n'
    )
    text = merge_metrics({"a": child, "b": child.replace(" 7", " 9")}, [("router_up", "up", "gauge", 1.0)])
    assert text.count("# TYPE llamacpp:tokens_predicted_total counter") == 1
    assert 'llamacpp:tokens_predicted_total{model="a"} 7' in text
    assert 'llamacpp:tokens_predicted_total{model="b"} 9' in text
    assert 'llamaserve:ttft_seconds_bucket{model="b",le="0.1"} 1' in text
    assert "router_up 1" in text


def test_the_model_list_from_a_folder_a_preset_and_the_hub_cache(tmp_path: Path) -> None:
    models = tmp_path / "models"
    single = _gguf(models / "solo-Q4_K_M.gguf")
    _gguf(models / "mmproj-only.gguf")  # a companion file, no model of its own
    first = _gguf(models / "big" / "big-00001-of-00002.gguf")
    _gguf(models / "big" / "big-00002-of-00002.gguf")
    _gguf(models / "big" / "mmproj-F16.gguf")
    extra = _gguf(tmp_path / "elsewhere.gguf")
    cache = tmp_path / "cache"
    snap = cache / "models--org--repo" / "snapshots" / "abc"
    hub = _gguf(snap / "repo-Q8_0.gguf")
    (cache / "models--org--repo" / "refs").mkdir(parents=True)
    (cache / "models--org--repo" / "refs" / "main").write_text("abc")
    preset = tmp_path / "p.ini"
    preset.write_text(
        f"[*]\nc = 1000\n[solo-Q4_K_M]\nc = 2000\nalias = s1, s2\n[extra]\nmodel = {extra}\n"
        "[from-hub]\nhf-repo = org/repo\ndedup-cache-models = true\n"
    )
    config = ServerConfig(router=True, models_dir=str(models), models_preset=str(preset))
    specs = load_catalog(config, {"LLAMA_CACHE": str(cache)})
    assert set(specs) == {"solo-Q4_K_M", "big", "extra", "from-hub", "org/repo:Q8_0"}
    assert specs["solo-Q4_K_M"].source == "preset" and specs["solo-Q4_K_M"].aliases == ("s1", "s2")
    solo = specs["solo-Q4_K_M"].preset
    assert (solo.get("-m"), solo.get("-c"), solo.get("--alias")) == (str(single), "2000", "s1, s2")
    assert specs["big"].source == "models_dir" and specs["big"].preset.get("-m") == str(first)
    assert len(specs["big"].files) == 2
    assert specs["extra"].preset.get("-c") == "1000"
    # hf-repo found in the cache: the child reads the file; the cache entry is hidden by the dedup.
    assert specs["from-hub"].preset.get("-m") == str(hub) and specs["from-hub"].preset.get("-hf") is None
    assert specs["org/repo:Q8_0"].hidden is True


def test_a_preset_section_without_weights_or_a_clashing_alias_is_refused(tmp_path: Path) -> None:
    preset = tmp_path / "p.ini"
    preset.write_text("[lonely]\nc = 10\n")
    with pytest.raises(ConfigError, match="lonely"):
        load_catalog(ServerConfig(router=True, models_preset=str(preset)), {"LLAMA_CACHE": str(tmp_path)})
    model = _gguf(tmp_path / "m.gguf")
    preset.write_text(f"[a]\nmodel = {model}\n[b]\nmodel = {model}\nalias = a\n")
    with pytest.raises(ConfigError, match="alias 'a'"):
        load_catalog(ServerConfig(router=True, models_preset=str(preset)), {"LLAMA_CACHE": str(tmp_path)})


def test_no_model_named_is_a_router_only_with_models_to_serve(tmp_path: Path) -> None:
    empty = {"LLAMA_CACHE": str(tmp_path / "cache")}
    assert config_from_args([], environ=empty).router is False  # the embedded model
    assert config_from_args(["--models-dir", str(tmp_path)], environ=empty).router is True
    _gguf(tmp_path / "cache" / "models--o--r" / "snapshots" / "x" / "r-F16.gguf")
    assert config_from_args([], environ=empty).router is True
    # --api-prefix is the router's own (its edge strips it); Vertex AI's prediction mode is not
    assert config_from_args(["--models-dir", str(tmp_path), "--api-prefix", "/x"], environ=empty).api_prefix == "/x"
