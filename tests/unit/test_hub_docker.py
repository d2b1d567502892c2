"""`-dr` spec parsing and layer picking, and `--cache-list` over a cache laid out by hand; no network."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamaserve.hub.cache import docker_cache_path, write_manifest
from llamaserve.hub.cache_list import format_cache_list, gguf_tag, list_cached_models
from llamaserve.hub.docker import (
    AUTH_ENV,
    DEFAULT_AUTH,
    DEFAULT_REGISTRY,
    REGISTRY_ENV,
    DockerRef,
    auth_url,
    gguf_layer_digest,
    parse_docker_ref,
    registry_url,
)
from llamaserve.hub.errors import DownloadError

HEX = "ab" * 32


def test_parse_docker_ref_defaults_as_llama_cpp() -> None:
    assert parse_docker_ref("gemma3") == DockerRef("ai/gemma3", "latest")
    assert parse_docker_ref("smollm2:135M-Q4_0") == DockerRef("ai/smollm2", "135M-Q4_0")
    assert parse_docker_ref("me/model:Q8_0") == DockerRef("me/model", "Q8_0")
    assert parse_docker_ref("org/group/model-v1.2") == DockerRef("org/group/model-v1.2", "latest")
    assert str(parse_docker_ref(" smollm2 ")) == "ai/smollm2:latest"
    for bad in ("", "Gemma3", "ai/", "/model", "a//b", "model:", "model:a:b", "model:-x", "a/b c"):
        with pytest.raises(DownloadError, match=r"\[<repo>/\]<model>\[:quant\]"):
            parse_docker_ref(bad)


def test_docker_cache_name_is_llama_cpps() -> None:
    assert docker_cache_path(Path("/c"), "ai/smollm2", "135M-Q4_0") == Path("/c/ai_smollm2_135M-Q4_0.gguf")
    assert docker_cache_path(Path("/c"), "a/b/c", "latest") == Path("/c/a_b_c_latest.gguf")


def test_registry_urls_from_the_environment() -> None:
    assert (registry_url({}), auth_url({})) == (DEFAULT_REGISTRY, DEFAULT_AUTH)
    env = {REGISTRY_ENV: "http://127.0.0.1:5000/", AUTH_ENV: "http://127.0.0.1:5001"}
    assert (registry_url(env), auth_url(env)) == ("http://127.0.0.1:5000", "http://127.0.0.1:5001")


def test_gguf_layer_is_picked_by_media_type() -> None:
    ref = DockerRef("ai/m", "latest")
    layers = [
        {"mediaType": "application/vnd.docker.ai.license", "digest": "sha256:" + "00" * 32},
        {"mediaType": "application/vnd.docker.ai.gguf.v3", "digest": "sha256:" + HEX.upper()},
        {"mediaType": "application/vnd.docker.ai.gguf.v3", "digest": "sha256:" + "11" * 32},
    ]
    assert gguf_layer_digest({"layers": layers}, ref) == "sha256:" + HEX
    assert gguf_layer_digest({"layers": [{"mediaType": "x-gguf-y", "digest": "sha256:" + HEX}]}, ref).endswith(HEX)
    with pytest.raises(DownloadError, match=r"no GGUF layer .* \(application/vnd.docker.ai.license\)"):
        gguf_layer_digest({"layers": layers[:1]}, ref)
    with pytest.raises(DownloadError, match=r"no GGUF layer .* \(no layers\)"):
        gguf_layer_digest({"manifests": []}, ref)
    with pytest.raises(DownloadError, match="invalid GGUF layer digest"):
        gguf_layer_digest({"layers": [{"mediaType": "application/vnd.docker.ai.gguf.v3", "digest": "md5:x"}]}, ref)


def test_gguf_tag_reads_the_name_as_llama_cpp() -> None:
    assert gguf_tag("SmolLM2-135M-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert gguf_tag("model.q8_0.gguf") == "Q8_0"
    assert gguf_tag("Q2_K_m-Q2_K-00001-of-00003.gguf") == "Q2_K"
    assert gguf_tag("Q2_K_m-Q2_K-00002-of-00003.gguf") is None  # only a first part counts
    for skipped in ("mmproj-model-f16.gguf", "model-mtp-Q8_0.gguf", "model.gguf", "model-Q4_0.gguf.part", "x.bin"):
        assert gguf_tag(skipped) is None, skipped


def _touch(cache: Path, *names: str) -> None:
    for name in names:
        (cache / name).write_bytes(b"GGUF")


def test_cache_list_over_a_seeded_cache(tmp_path: Path) -> None:
    write_manifest(tmp_path, "user/model-GGUF", None, ["model-Q4_K_M.gguf"])
    write_manifest(tmp_path, "user/model-GGUF", "Q8_0", ["model-Q8_0.gguf"])
    write_manifest(tmp_path, "user/model-GGUF_v2", None, ["m-F16.gguf"])
    write_manifest(
        tmp_path, "org/split", "Q6_K", ["Q6_K/s-Q6_K-00001-of-00002.gguf", "Q6_K/s-Q6_K-00002-of-00002.gguf"]
    )
    _touch(
        tmp_path,
        "user_model-GGUF_model-Q8_0.gguf",
        "user_model-GGUF_model-Q4_K_M.gguf",
        "user_model-GGUF_model-q4_k_m.gguf",  # the same tag once more: listed once
        "user_model-GGUF_mmproj-model-f16.gguf",
        "user_model-GGUF_model-IQ4_XS.gguf.part",  # incomplete
        "user_model-GGUF_v2_m-F16.gguf",  # belongs to the longer repo name, not to user/model-GGUF
        "org_split_Q6_K_s-Q6_K-00001-of-00002.gguf",
        "org_split_Q6_K_s-Q6_K-00002-of-00002.gguf",
        "other_repo_model-Q4_0.gguf",  # no manifest: its repo cannot be told from the flat name
        "ai_smollm2_latest.gguf",  # a docker model
    )
    models = list_cached_models(tmp_path)
    assert models == [
        "org/split:Q6_K",
        "user/model-GGUF:Q4_K_M",
        "user/model-GGUF:Q8_0",
        "user/model-GGUF_v2:F16",
    ]
    assert format_cache_list(models) == (
        "number of models in cache: 4\n"
        "   1. org/split:Q6_K\n"
        "   2. user/model-GGUF:Q4_K_M\n"
        "   3. user/model-GGUF:Q8_0\n"
        "   4. user/model-GGUF_v2:F16\n"
    )


def test_cache_list_of_an_empty_or_missing_cache(tmp_path: Path) -> None:
    assert list_cached_models(tmp_path / "absent") == []
    assert format_cache_list([]) == "number of models in cache: 0\n"
    assert format_cache_list(["u/m:Q4_0"] * 10).splitlines()[-1] == "  10. u/m:Q4_0"
