"""Model downloads without a network: which file `-hf` picks, cache naming, the progress bar."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from llamaserve.hub.cache import (
    cache_dir,
    cached_repo_files,
    hf_cache_path,
    read_manifest,
    url_cache_path,
    write_manifest,
)
from llamaserve.hub.errors import DownloadError
from llamaserve.hub.hf import file_url, hub_endpoint
from llamaserve.hub.progress import MIB, ProgressBar
from llamaserve.hub.select import RepoSpec, parse_repo, pick_files, split_parts

LISTING = [
    "README.md",
    "mmproj-model-f16.gguf",
    "model-IQ4_XS.gguf",
    "model-Q4_K.gguf",
    "model-Q4_K_M.gguf",
    "model-Q8_0.gguf",
    "Q6_K/model-Q6_K-00001-of-00002.gguf",
    "Q6_K/model-Q6_K-00002-of-00002.gguf",
]


def test_parse_repo() -> None:
    # Surrounding blanks go; the tag is kept as written (pick_files matches it ignoring case).
    assert parse_repo(" ggml-org/gemma-3-1b-it-GGUF:Q8_0\n") == RepoSpec("ggml-org/gemma-3-1b-it-GGUF", "Q8_0")
    spec = parse_repo("user/model.v2-GGUF:q4_k_m")
    assert (spec.repo, spec.tag) == ("user/model.v2-GGUF", "q4_k_m")
    assert parse_repo("user/model") == parse_repo("user/model:latest") == parse_repo("user/model:LATEST")
    assert parse_repo("user/model") == RepoSpec("user/model", None)
    for bad in ("model", "a/b/c", "user/model:", "/model", "user/"):
        with pytest.raises(DownloadError, match="<user>/<model>"):
            parse_repo(bad)


def test_default_quant_is_q4_k_m_and_mmproj_is_never_picked() -> None:
    assert pick_files(LISTING, None, "u/m") == ["model-Q4_K_M.gguf"]
    # No Q4_K_M: the first GGUF that is not a projector.
    assert pick_files(["mmproj-f16.gguf", "b-Q8_0.gguf", "a-F16.gguf"], None, "u/m") == ["b-Q8_0.gguf"]


def test_tag_matches_case_insensitively_and_whole_words_first() -> None:
    assert pick_files(LISTING, "q8_0", "u/m") == ["model-Q8_0.gguf"]
    # "Q4_K" names its own file, not the Q4_K_M listed after it... or before it.
    assert pick_files(LISTING, "Q4_K", "u/m") == ["model-Q4_K.gguf"]
    assert pick_files(["m-Q4_K_M.gguf", "m-Q4_K.gguf"], "q4_k", "u/m") == ["m-Q4_K.gguf"]
    # A substring match is the fallback (here the quant is glued to the name with '_').
    assert pick_files(["model_q5_k_m.gguf"], "Q5_K_M", "u/m") == ["model_q5_k_m.gguf"]
    with pytest.raises(DownloadError, match="no GGUF file matching quant 'Q2_K'"):
        pick_files(LISTING, "Q2_K", "u/m")


def test_split_models_come_whole_first_part_first() -> None:
    assert pick_files(LISTING, "Q6_K", "u/m") == [
        "Q6_K/model-Q6_K-00001-of-00002.gguf",
        "Q6_K/model-Q6_K-00002-of-00002.gguf",
    ]
    assert split_parts("x-00003-of-00003.gguf") == [
        "x-00001-of-00003.gguf",
        "x-00002-of-00003.gguf",
        "x-00003-of-00003.gguf",
    ]
    assert split_parts("plain.gguf") == ["plain.gguf"]
    with pytest.raises(DownloadError, match="lacks part"):
        pick_files(["m-00001-of-00003.gguf", "m-00003-of-00003.gguf"], None, "u/m")


def test_repo_without_gguf() -> None:
    with pytest.raises(DownloadError, match="no GGUF model file"):
        pick_files(["README.md", "mmproj-only.gguf", "model.safetensors"], None, "u/m")


def test_cache_dir_precedence(tmp_path: Path) -> None:
    assert cache_dir({"LLAMA_CACHE": str(tmp_path), "XDG_CACHE_HOME": "/x"}) == tmp_path
    assert cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/llama.cpp")
    assert cache_dir({"HOME": "/home/u"}) == Path("/home/u/.cache/llama.cpp")


def test_cache_names_and_manifest(tmp_path: Path) -> None:
    assert hf_cache_path(tmp_path, "u/m", "Q6_K/a-00001-of-00002.gguf").name == "u_m_Q6_K_a-00001-of-00002.gguf"
    assert url_cache_path(tmp_path, "https://h.example/d/My%20Model.gguf?sig=1").name == "My Model.gguf"
    assert read_manifest(tmp_path, "u/m", None) is None
    write_manifest(tmp_path, "u/m", None, ["a-00001-of-00002.gguf", "a-00002-of-00002.gguf"])
    assert (tmp_path / "manifest=u=m=latest.json").is_file()
    assert read_manifest(tmp_path, "u/m", None) == ["a-00001-of-00002.gguf", "a-00002-of-00002.gguf"]
    for name in ("u_m_a.gguf", "u_m_b.gguf.part", "u_mx_c.gguf", "u_m_d.gguf.lock"):
        (tmp_path / name).write_bytes(b"GGUF")
    assert cached_repo_files(tmp_path, "u/m") == ["a.gguf"]


def test_endpoint_and_urls() -> None:
    assert hub_endpoint({}) == "https://huggingface.co"
    assert hub_endpoint({"HF_ENDPOINT": "http://127.0.0.1:9/"}) == "http://127.0.0.1:9"
    assert hub_endpoint({"HF_ENDPOINT": "http://a", "MODEL_ENDPOINT": "http://b"}) == "http://b"
    assert file_url("http://h", "u/m", "Q6_K/a b.gguf") == "http://h/u/m/resolve/main/Q6_K/a%20b.gguf"


def test_progress_bar_off_a_terminal_writes_a_few_lines() -> None:
    out = io.StringIO()
    bar = ProgressBar("m.gguf", 100 * MIB, stream=out, tty=False)
    for done in range(0, 100 * MIB + 1, MIB):
        bar.update(done)
    bar.finish()
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in out.getvalue()
    assert "25.0%" in lines[0] and "100.0%" in lines[-1] and "100.0/100.0 MiB" in lines[-1]
    assert all("MiB/s" in line for line in lines)


def test_progress_bar_on_a_terminal_redraws_one_line() -> None:
    out = io.StringIO()
    bar = ProgressBar("m.gguf", 10 * MIB, start=5 * MIB, stream=out, tty=True)
    bar.update(6 * MIB)
    bar.update(10 * MIB)
    bar.finish()
    text = out.getvalue()
    assert text.startswith("\r") and text.count("\n") == 1 and text.count("\r") == 2
    assert "60.0%" in text and text.rstrip().endswith("\033[K") and "100.0%" in text


def test_pick_mmproj_takes_the_projector_of_highest_precision() -> None:
    from llamaserve.hub.select import pick_mmproj

    files = ["model-Q4_K_M.gguf", "mmproj-model-Q8_0.gguf", "mmproj-model-f16.gguf", "README.md"]
    assert pick_mmproj(files) == "mmproj-model-f16.gguf"
    assert pick_mmproj(["mmproj-x-Q8_0.gguf"]) == "mmproj-x-Q8_0.gguf"
    assert pick_mmproj(["model-Q4_K_M.gguf"]) is None


def test_mmproj_resolution_offline_from_the_cache_and_no_mmproj(tmp_path: Path) -> None:
    from dataclasses import replace

    from llamaserve.config import ServerConfig
    from llamaserve.hub.cache import hf_cache_path
    from llamaserve.hub.mmproj import resolve_mmproj

    env = {"LLAMA_CACHE": str(tmp_path)}
    proj = hf_cache_path(tmp_path, "user/vision-GGUF", "mmproj-vision-f16.gguf")
    proj.parent.mkdir(parents=True, exist_ok=True)
    proj.write_bytes(b"GGUF")
    base = ServerConfig(model="m.gguf", hf_repo="user/vision-GGUF:Q4_K_M", offline=True)
    assert resolve_mmproj(base, env) == str(proj)
    assert resolve_mmproj(replace(base, mmproj_auto=False), env) is None  # --no-mmproj
    assert resolve_mmproj(replace(base, mmproj="own.gguf"), env) == "own.gguf"  # -mm wins
    assert resolve_mmproj(replace(base, hf_repo="user/other-GGUF"), env) is None  # offline, none cached
