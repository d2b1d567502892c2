"""The draft model's own flags on a real server: its tensor overrides, devices and thread pools
(-otd, -devd, -Cd, --cpu-strict-draft, -td), its download (-hfd) and the *-spec presets that name
a target and a draft repo, fetched from a stand-in hub on loopback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from llamaserve.cli import config_from_args
from tests.server.conftest import REPO, free_port, start_server, stop_server
from tests.server.standin_hub import StandInHub

QWEN_7B = "ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF"
QWEN_DRAFT = "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF"
PROMPT = "Count: one two three four five six seven eight nine ten. Count again: one two three"


def _complete(url: str) -> dict[str, object]:
    body = {"prompt": PROMPT, "temperature": 0, "n_predict": 12}
    r = httpx.post(f"{url}/completion", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _threads_on(pid: int, cpus: str) -> int:
    """How many of the process's threads may run only on `cpus` (a Cpus_allowed_list)."""
    n = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        match = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
        n += bool(match and match.group(1) == cpus)
    return n


def test_the_draft_gets_its_own_tensor_overrides_and_thread_pools(model_path: str, tmp_path: Path) -> None:
    args = ["-m", model_path, "-md", model_path, "--spec-type", "draft-simple", "-c", "512", "-np", "1", "-t", "1"]
    args += ["-otd", r"blk\.0\.attn_q\.weight=CPU", "-td", "2", "-Cd", "1", "--cpu-strict-draft", "1", "-v"]
    srv = start_server(args, tmp_path)
    try:
        answer = _complete(srv.url)
        timings = answer["timings"]
        assert isinstance(timings, dict) and timings["draft_n"] > 0
        pinned = _threads_on(srv.process.pid, "0")
        log = srv.log()
    finally:
        stop_server(srv)
    # llama.cpp reports each overridden tensor while loading: once, for the draft model only.
    overridden = re.findall(r"tensor (\S+) \(.*\) buffer type overridden to", log)
    assert overridden == ["blk.0.attn_q.weight"], overridden
    assert log.index("loading draft model") < log.index("buffer type overridden")
    assert "draft thread pools: 2 threads on CPUs [0] (poll 50, strict True, prio 0)" in log
    # The draft pool's worker thread is pinned to CPU 0 (the target's threads are not pinned).
    if (os.cpu_count() or 1) > 1:
        assert pinned >= 1


def test_a_draft_device_or_buffer_type_this_build_lacks_is_refused(model_path: str, tmp_path: Path) -> None:
    base = ["--port", str(free_port()), "-m", model_path, "-md", model_path, "--spec-type", "draft-simple"]
    for extra, message in ((["-devd", "NoSuchGPU"], "NoSuchGPU"), (["-otd", "output=NoSuchBuffer"], "NoSuchBuffer")):
        proc = subprocess.run(
            [sys.executable, "-m", "llamaserve", *base, *extra], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert "loading draft model" in proc.stderr  # the target loaded; the draft's own setting failed


def _hub(model_path: str) -> StandInHub:
    """The repos the -spec presets name, each serving SmolLM2 under the preset's file name."""
    model = Path(model_path)
    hub = StandInHub(
        {
            QWEN_7B: {"qwen2.5-coder-7b-q8_0.gguf": model},
            QWEN_DRAFT: {"qwen2.5-coder-0.5b-q8_0.gguf": model, "README.md": b"# draft"},
        }
    )
    hub.start()
    return hub


def test_a_spec_preset_fetches_the_target_and_the_draft_and_speculates(model_path: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    hub = _hub(model_path)
    env = {"LLAMA_CACHE": str(cache), "HF_ENDPOINT": hub.url}
    try:
        port = free_port()
        # Flags after the preset win, as in llama-server: a free port and a small context.
        args = ["--fim-qwen-7b-spec", "--port", str(port), "-c", "1024", "-np", "1", "-t", "1"]
        srv = start_server(args, tmp_path, env=env, port=port)
        try:
            answer = _complete(srv.url)
            slot = httpx.get(f"{srv.url}/slots", timeout=30).json()[0]
            log = srv.log()
        finally:
            stop_server(srv)
        assert f"downloading {hub.url}/{QWEN_7B}/resolve/main/qwen2.5-coder-7b-q8_0.gguf" in log
        assert f"downloading {hub.url}/{QWEN_DRAFT}/resolve/main/qwen2.5-coder-0.5b-q8_0.gguf" in log
        assert slot["params"]["speculative.types"] == "draft-simple"
        timings = answer["timings"]
        assert isinstance(timings, dict) and timings["draft_n"] > 0
        # -hfd on its own, with a quant tag: the repo is listed and the file picked as -hf would
        # (the one the preset downloaded, so the cache serves it).
        cfg = config_from_args(["-m", model_path, "-hfd", f"{QWEN_DRAFT}:Q8_0"], environ=env)
        assert cfg.spec.draft_model == str(cache / "ggml-org_Qwen2.5-Coder-0.5B-Q8_0-GGUF_qwen2.5-coder-0.5b-q8_0.gguf")
        assert hub.requests_for("/api/models/" + QWEN_DRAFT)
    finally:
        hub.stop()


def test_offline_a_spec_preset_fails_as_any_hf_model_does(tmp_path: Path) -> None:
    env = {**os.environ, "LLAMA_CACHE": str(tmp_path), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    for args, missing in (
        (["--fim-qwen-14b-spec"], "ggml-org/Qwen2.5-Coder-14B-Q8_0-GGUF"),
        (["-hf", QWEN_7B, "-hff", "qwen2.5-coder-7b-q8_0.gguf"], QWEN_7B),
        (["-hfd", QWEN_DRAFT, "--spec-type", "draft-simple"], QWEN_DRAFT),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "llamaserve", "--port", str(free_port()), *args, "--offline"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1, (args, proc.stderr)
        assert f"--offline: {missing}" in proc.stderr and "is not in the cache" in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
