"""`-hf` and `--model-url` against a stand-in hub on loopback serving the real SmolLM2 file."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llamaserve.cli import config_from_args
from llamaserve.hub.errors import DownloadError
from tests.server.conftest import REPO, free_port, start_server, stop_server
from tests.server.standin_hub import StandInHub

REPO_ID = "fake/SmolLM2-135M-Instruct-GGUF"
Q4 = "SmolLM2-135M-Instruct-Q4_K_M.gguf"
CACHED_NAME = "fake_SmolLM2-135M-Instruct-GGUF_" + Q4
SERVER_ARGS = ["-c", "2048", "-np", "1", "-t", "1", "--no-mmproj"]  # one thread: steady on a busy 2-core machine


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def model_sha(model_path: str) -> str:
    return sha256(Path(model_path))


def make_hub(model_path: str, **kwargs: object) -> StandInHub:
    # A projector and a decoy quant sit beside the real file: picking either as the model would
    # fail to load. (-hf fetches a repo's projector too unless --no-mmproj, as llama-server does;
    # tests/unit/test_hub.py covers that choice, these tests pass --no-mmproj.)
    hub = StandInHub(
        {
            REPO_ID: {
                "README.md": b"# fake",
                "mmproj-SmolLM2-f16.gguf": b"GGUF not a model",
                Q4: Path(model_path),
                "SmolLM2-135M-Instruct-Q8_0.gguf": b"GGUF decoy",
            },
            "fake/docs-only": {"README.md": b"# nothing to serve"},
            "fake/split-GGUF": {f"Q2_K/m-Q2_K-{i:05d}-of-00003.gguf": b"GGUF part %d" % i for i in (1, 2, 3)},
        },
        files={"smol.gguf": Path(model_path)},
        **kwargs,
    )  # type: ignore[arg-type]
    hub.start()
    return hub


@pytest.fixture()
def hub(model_path: str) -> Iterator[StandInHub]:
    h = make_hub(model_path)
    yield h
    h.stop()


def hub_env(hub_url: str, cache: Path) -> dict[str, str]:
    return {"LLAMA_CACHE": str(cache), "HF_ENDPOINT": hub_url}


def chat(url: str) -> str:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0},
    )
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llamaserve", "--port", str(free_port()), *args],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hf_download_then_cache_with_the_hub_down_and_offline(model_path: str, model_sha: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    hub = make_hub(model_path)
    env = hub_env(hub.url, cache)
    try:
        srv = start_server(["-hf", REPO_ID, *SERVER_ARGS], tmp_path, env=env)
        try:
            log = srv.log()
            assert f"downloading {hub.url}/{REPO_ID}/resolve/main/{Q4}" in log
            # Off a terminal the bar writes a line per quarter, ending at 100% with the rate.
            assert "25." in log and "100.0%" in log and "MiB/s" in log
            assert chat(srv.url)
        finally:
            stop_server(srv)
        cached = cache / CACHED_NAME
        assert cached.is_file() and sha256(cached) == model_sha
        assert (
            not list(cache.glob("*.part"))
            and (cache / "manifest=fake=SmolLM2-135M-Instruct-GGUF=latest.json").is_file()
        )
        # Neither the projector nor the other quant was fetched.
        assert not hub.requests_for("mmproj") and not hub.requests_for("Q8_0")
    finally:
        hub.stop()

    # The hub is gone: the cached file serves, with and without --offline.
    for extra in ([], ["--offline"]):
        srv = start_server(["-hf", REPO_ID, *extra, *SERVER_ARGS], tmp_path, env=env)
        try:
            assert f"using cached {cache / CACHED_NAME}" in srv.log()
            assert chat(srv.url)
        finally:
            stop_server(srv)


def test_resume_from_a_partial_file_uses_a_range_request(
    hub: StandInHub, model_path: str, model_sha: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    seeded = 40 * 1024 * 1024
    with open(model_path, "rb") as src:
        (cache / (CACHED_NAME + ".part")).write_bytes(src.read(seeded))
    # The tag in another case still names the Q4_K_M file.
    srv = start_server(["-hf", f"{REPO_ID}:q4_k_m", *SERVER_ARGS], tmp_path, env=hub_env(hub.url, cache))
    try:
        assert chat(srv.url)
    finally:
        stop_server(srv)
    transfers = hub.requests_for(f"/cdn/{REPO_ID}/{Q4}")
    assert [t.headers.get("range") for t in transfers] == [f"bytes={seeded}-"]
    assert sha256(cache / CACHED_NAME) == model_sha
    assert not (cache / (CACHED_NAME + ".part")).exists()


def test_model_url_download(hub: StandInHub, model_sha: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    url = f"{hub.url}/files/smol.gguf"
    srv = start_server(["--model-url", url, *SERVER_ARGS], tmp_path, env={"LLAMA_CACHE": str(cache)})
    try:
        assert "100.0%" in srv.log()
        assert chat(srv.url)
    finally:
        stop_server(srv)
    assert sha256(cache / "smol.gguf") == model_sha
    # Cached now: --offline finds it without asking.
    before = len(hub.seen)
    cfg = config_from_args(["--model-url", url, "--offline"], environ={"LLAMA_CACHE": str(cache)})
    assert cfg.model == str(cache / "smol.gguf") and len(hub.seen) == before


def test_a_dropped_transfer_resumes_within_the_same_run(
    model_path: str, model_sha: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    hub = make_hub(model_path, cut_first_transfer_at=10 * 1024 * 1024)
    try:
        cfg = config_from_args(["-hf", REPO_ID, "--no-mmproj"], environ=hub_env(hub.url, tmp_path))
    finally:
        hub.stop()
    assert cfg.model == str(tmp_path / CACHED_NAME) and sha256(Path(cfg.model)) == model_sha
    ranges = [t.headers.get("range") for t in hub.requests_for(f"/cdn/{REPO_ID}/")]
    assert ranges == [None, f"bytes={10 * 1024 * 1024}-"]
    assert "100.0%" in capfd.readouterr().err


def test_split_model_fetches_every_part(hub: StandInHub, tmp_path: Path) -> None:
    env = hub_env(hub.url, tmp_path)
    cfg = config_from_args(["-hf", "fake/split-GGUF:Q2_K"], environ=env)
    parts = [tmp_path / f"fake_split-GGUF_Q2_K_m-Q2_K-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert cfg.model == str(parts[0]) and all(p.is_file() for p in parts)
    # llama.cpp finds parts 2 and 3 beside part 1 by this naming.
    assert parts[2].read_bytes() == b"GGUF part 3"
    hub.stop()
    assert config_from_args(["-hf", "fake/split-GGUF:Q2_K", "--offline"], environ=env).model == str(parts[0])


def test_hf_token_is_sent_as_bearer(tmp_path: Path) -> None:
    hub = StandInHub({"private/tiny-GGUF": {"tiny-Q4_K_M.gguf": b"GGUF tiny"}}, token="s3cret")
    hub.start()
    try:
        env = hub_env(hub.url, tmp_path)
        with pytest.raises(DownloadError, match="hf-token"):
            config_from_args(["-hf", "private/tiny-GGUF"], environ=env)
        cfg = config_from_args(["-hf", "private/tiny-GGUF"], environ={**env, "HF_TOKEN": "s3cret"})
        assert Path(cfg.model).read_bytes() == b"GGUF tiny"
        assert all(s.headers.get("authorization") == "Bearer s3cret" for s in hub.seen[1:])
    finally:
        hub.stop()


def test_errors_exit_1_with_a_message(hub: StandInHub, tmp_path: Path) -> None:
    env = hub_env(hub.url, tmp_path)
    down = hub_env(f"http://127.0.0.1:{free_port()}", tmp_path)
    cases = [
        (["-hf", "nobody/missing-GGUF"], env, "repo nobody/missing-GGUF not found"),
        (["-hf", "fake/docs-only"], env, "has no GGUF model file"),
        (["-hf", f"{REPO_ID}:IQ1_S"], env, "no GGUF file matching quant 'IQ1_S'"),
        (["-hf", REPO_ID, "-hff", "missing.gguf"], env, "not found (HTTP 404)"),
        (["-hf", REPO_ID], down, "cannot reach the model hub"),
        (["-hf", REPO_ID, "--offline"], env, "--offline: fake/SmolLM2-135M-Instruct-GGUF is not in the cache"),
        (["--model-url", f"{hub.url}/files/none.gguf"], env, "not found (HTTP 404)"),
        (["--model-url", f"{hub.url}/api/models/{REPO_ID}"], env, "is not a GGUF file"),
    ]
    for args, environ, message in cases:
        proc = run_cli(args, environ)
        assert proc.returncode == 1, (args, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
    assert not list(tmp_path.glob("*.gguf"))
