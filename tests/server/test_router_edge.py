"""The router's edge as the single server's: the agent tools, the MCP proxy, CORS, the site
guard and --api-prefix answered by the router itself; a model whose process died is started
again for the next request; /props' build_info in llama.cpp's form; models downloaded
(`POST /models`, progress on `/models/sse`, cancelled by `/models/unload`) and removed
(`DELETE /models`). One router over a models folder holding the embedded SmolLM2, under
/llama, with --tools and a stand-in Hugging Face hub; and an `--upstreams` front with tools
of its own in front of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server, stop_server
from tests.server.standin_hub import StandInHub

SMOL = "smol"
PREFIX = "/llama"
BUILD_INFO = re.compile(r"^b\d+-[0-9a-f]{7,}$|^b0-unknown$")
FILE = "SmolLM2-135M-Instruct-Q8_0.gguf"
MODEL_ID = "fake/SmolLM2-GGUF:Q8_0"
SLOW_ID = "fake/slow-GGUF:Q8_0"


@pytest.fixture(scope="module")
def hub(model_path: str) -> Iterator[StandInHub]:
    stand_in = StandInHub(
        {"fake/SmolLM2-GGUF": {FILE: Path(model_path)}, "fake/slow-GGUF": {FILE: Path(model_path)}},
        slow=frozenset({f"fake/slow-GGUF/{FILE}"}),
    )
    stand_in.start()
    yield stand_in
    stand_in.stop()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("download-cache")


@pytest.fixture(scope="module")
def tools_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tools-root")
    (root / "note.txt").write_text("behind the router\n")
    return root


@pytest.fixture(scope="module")
def router(
    model_path: str, tools_root: Path, hub: StandInHub, cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("edge-router")
    models = tmp / "models"
    models.mkdir()
    (models / f"{SMOL}.gguf").symlink_to(model_path)
    args = ["--models-dir", str(models), "--api-prefix", PREFIX, "--tools", "all", "-c", "512", "-np", "1"]
    env = {"LLAMA_CACHE": str(cache), "HF_ENDPOINT": hub.url, "LLAMASERVE_TOOLS_ROOT": str(tools_root)}
    srv = start_server([*args, "-t", "2", "-n", "4", "--temp", "0"], tmp, env=env, health_path=f"{PREFIX}/health")
    yield srv
    stop_server(srv)


def _api(srv: RunningServer) -> str:
    return srv.url + PREFIX


def _chat(base: str, model: str = SMOL) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=180)


def _status(base: str) -> dict[str, Any]:
    models = httpx.get(f"{base}/models", timeout=10).json()["data"]
    status: dict[str, Any] = next(m for m in models if m["id"] == SMOL)["status"]
    return status


def _read_note(base: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"tool": "read_file", "params": {"path": "note.txt"}}
    return httpx.post(f"{base}/tools", json=body, headers=headers, timeout=30)


def test_the_router_runs_the_agent_tools_itself_with_no_model_named(router: RunningServer) -> None:
    """llama-server's router answers /tools itself; before, ours wanted a model for it (400)."""
    base = _api(router)
    listing = httpx.get(f"{base}/tools", timeout=10)
    assert listing.status_code == 200, listing.text
    assert "read_file" in {t["tool"] for t in listing.json()}
    res = _read_note(base)
    assert res.status_code == 200, res.text
    assert "behind the router" in str(res.json())
    # No model was loaded for it, and no child got the tools.
    assert _status(base)["value"] == "unloaded"
    # The MCP proxy is off: 403 as the single server (and llama-server's router) answers.
    proxy = httpx.get(f"{base}/cors-proxy", params={"url": "http://127.0.0.1:1/"}, timeout=10)
    assert proxy.status_code == 403 and proxy.json()["error"]["type"] == "feature_disabled"
    assert httpx.get(f"{base}/props", timeout=10).json()["cors_proxy_enabled"] is False


def test_the_router_guards_the_tools_and_answers_cors_as_the_single_server(router: RunningServer) -> None:
    base = _api(router)
    foreign = _read_note(base, {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert foreign.status_code == 403 and foreign.json()["error"]["type"] == "permission_error"
    rebound = _read_note(base, {"Host": "rebound.example"})
    assert rebound.status_code == 403
    # --tools makes --cors-origins default to localhost: a local page is let in, others are not.
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "Authorization"}
    local = httpx.options(f"{base}/completions", headers={"Origin": "http://localhost:8080", **preflight}, timeout=10)
    assert local.status_code == 200
    # llama-server's spelling of the name (clients that copy headers into a dict look it up so)
    assert ("Access-Control-Allow-Origin", "http://localhost:8080") in [
        (k.decode(), v.decode()) for k, v in local.headers.raw
    ]
    evil = httpx.options(f"{base}/completions", headers={"Origin": "http://evil.com", **preflight}, timeout=10)
    assert evil.status_code == 200 and "access-control-allow-origin" not in evil.headers


def test_api_prefix_holds_for_the_routers_own_routes_and_the_forwarded_ones(router: RunningServer) -> None:
    """llama-server registers every route under the prefix, so an unprefixed path is a 404."""
    assert httpx.get(f"{router.url}/models", timeout=10).status_code == 404
    assert httpx.get(f"{router.url}/tools", timeout=10).status_code == 404
    assert SMOL in {m["id"] for m in httpx.get(f"{_api(router)}/v1/models", timeout=10).json()["data"]}
    res = _chat(_api(router))
    assert res.status_code == 200 and res.json()["model"] == SMOL, res.text


def test_build_info_is_llama_cpps_build_and_commit(router: RunningServer) -> None:
    own = httpx.get(f"{_api(router)}/props", timeout=10).json()
    assert BUILD_INFO.match(own["build_info"]), own["build_info"]
    child = httpx.get(f"{_api(router)}/props", params={"model": SMOL}, timeout=120).json()
    assert child["build_info"] == own["build_info"]


def _child_pid(args: list[str]) -> int:
    port = args[args.index("--port") + 1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in argv and argv[argv.index(b"--port") + 1] == port.encode() and b"--alias" in argv:
            return int(entry.name)
    raise AssertionError(f"no child on port {port}")


def test_the_first_request_after_a_child_dies_is_served_by_a_new_one(router: RunningServer) -> None:
    """The C++ router answers this request with an error; ours starts the model again."""
    base = _api(router)
    assert _chat(base).status_code == 200
    status = _status(base)
    assert status["value"] == "loaded"
    assert "--tools" not in status["args"]  # the tools are the router's own
    os.kill(_child_pid(status["args"]), signal.SIGKILL)
    res = _chat(base)  # at once: the router has not yet seen the process go
    assert res.status_code == 200 and res.json()["model"] == SMOL, res.text
    assert _status(base)["value"] == "loaded"


@pytest.fixture(scope="module")
def front(router: RunningServer, tools_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """An --upstreams front with its own key, tools and prefix, in front of the router."""
    tmp = tmp_path_factory.mktemp("front")
    args = ["--upstreams", _api(router), "--api-key", "sk-front", "--tools", "read_file", "--api-prefix", "/f"]
    srv = start_server(args, tmp, env={"LLAMASERVE_TOOLS_ROOT": str(tools_root)}, health_path="/f/health")
    yield srv
    stop_server(srv)


def test_the_upstreams_front_does_at_its_edge_what_the_single_server_does(front: RunningServer) -> None:
    base = front.url + "/f"
    key = {"Authorization": "Bearer sk-front"}
    assert _read_note(base).status_code == 401  # the key first
    res = _read_note(base, key)
    assert res.status_code == 200 and "behind the router" in str(res.json()), res.text
    foreign = _read_note(base, {**key, "Origin": "http://evil.example"})
    assert foreign.status_code == 403 and foreign.json()["error"]["type"] == "permission_error"
    assert httpx.get(f"{front.url}/v1/models", headers=key, timeout=10).status_code == 404  # unprefixed
    # What the front does not serve itself goes to the router behind, unprefixed there by its own edge.
    deadline = time.time() + 30
    while httpx.get(f"{base}/health", timeout=10).status_code != 200:
        assert time.time() < deadline
        time.sleep(0.2)
    listing = httpx.get(f"{base}/v1/models", headers=key, timeout=10)
    assert listing.status_code == 200 and SMOL in {m["id"] for m in listing.json()["data"]}, listing.text


@contextlib.contextmanager
def _model_events(base: str) -> Iterator[list[dict[str, Any]]]:
    """`/models/sse`'s events as they come, collected from the moment the stream is open."""
    events: list[dict[str, Any]] = []
    ready, stop = threading.Event(), threading.Event()

    def listen() -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.stream("GET", f"{base}/models/sse", timeout=None) as res:
            ready.set()
            for line in res.iter_lines():
                if stop.is_set():
                    return
                if line.startswith("data: "):
                    events.append(json.loads(line[len("data: ") :]))

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield events
    finally:
        stop.set()


def _wait_for(events: list[dict[str, Any]], what: Callable[[dict[str, Any]], bool], timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not any(what(e) for e in list(events)):
        assert time.time() < deadline, events[-5:]
        time.sleep(0.05)


def _ids(base: str) -> dict[str, dict[str, Any]]:
    return {m["id"]: m for m in httpx.get(f"{base}/models", timeout=10).json()["data"]}


def test_post_models_downloads_in_the_background_and_delete_removes_it(router: RunningServer, cache: Path) -> None:
    """llama-server's shapes: `{"success": true}`, then download_progress / download_finished
    events, the model listed and servable; DELETE stops it, deletes its files, model_remove."""
    base = _api(router)
    with _model_events(base) as events:
        res = httpx.post(f"{base}/models", json={"model": MODEL_ID}, timeout=30)
        assert res.status_code == 200 and res.json() == {"success": True}, res.text
        _wait_for(events, lambda e: e["event"] == "download_finished" and e["model"] == MODEL_ID)
    progress = [e["data"] for e in events if e["event"] == "download_progress" and e["model"] == MODEL_ID]
    assert progress and all(p["done"] == p["total"] > 0 for p in progress[-1].values()), progress[-1:]
    listed = _ids(base)[MODEL_ID]
    assert listed["source"] == "cache" and listed["can_remove"] is True and listed["status"]["value"] == "unloaded"
    served = _chat(base, MODEL_ID)
    assert served.status_code == 200 and served.json()["model"] == MODEL_ID, served.text
    again = httpx.post(f"{base}/models", json={"model": MODEL_ID}, timeout=30)
    assert again.status_code == 400 and "already exists" in again.json()["error"]["message"]

    with _model_events(base) as events:
        gone = httpx.delete(f"{base}/models", params={"model": MODEL_ID}, timeout=60)
        assert gone.status_code == 200 and gone.json() == {"success": True}, gone.text
        _wait_for(events, lambda e: e["event"] == "model_remove" and e["model"] == MODEL_ID, 10)
    assert MODEL_ID not in _ids(base)
    assert not [p.name for p in cache.iterdir() if p.name.startswith("fake_SmolLM2-GGUF_") or "SmolLM2-GGUF" in p.name]


def test_what_cannot_be_downloaded_or_removed_is_a_4xx(router: RunningServer) -> None:
    base = _api(router)
    missing = httpx.post(f"{base}/models", json={"model": "fake/nothing-GGUF"}, timeout=30)
    assert missing.status_code == 400 and "model validation failed" in missing.json()["error"]["message"]
    no_quant = httpx.post(f"{base}/models", json={"model": "fake/SmolLM2-GGUF:Q2_K"}, timeout=30)
    assert no_quant.status_code == 400, no_quant.text
    assert httpx.post(f"{base}/models", json={}, timeout=10).status_code == 400
    folder = httpx.delete(f"{base}/models", params={"model": SMOL}, timeout=10)
    assert folder.status_code == 400 and "not removable" in folder.json()["error"]["message"]
    assert httpx.delete(f"{base}/models", params={"model": "nobody/none"}, timeout=10).status_code == 404
    # It changes the machine: a page of another site cannot start one (api/site_guard.py).
    plain = httpx.post(
        f"{base}/models", content=json.dumps({"model": MODEL_ID}), headers={"Content-Type": "text/plain"}, timeout=10
    )
    assert plain.status_code == 403


def test_models_unload_cancels_a_download(router: RunningServer, cache: Path) -> None:
    base = _api(router)
    with _model_events(base) as events:
        res = httpx.post(f"{base}/models", json={"model": SLOW_ID}, timeout=30)
        assert res.status_code == 200, res.text
        _wait_for(events, lambda e: e["event"] == "download_progress" and e["model"] == SLOW_ID, 30)
        status = _ids(base)[SLOW_ID]["status"]
        assert status["value"] == "downloading" and status["progress"], status
        cancel = httpx.post(f"{base}/models/unload", json={"model": SLOW_ID}, timeout=60)
        assert cancel.status_code == 200 and cancel.json() == {"success": True}, cancel.text
        _wait_for(events, lambda e: e["event"] == "download_failed" and e["model"] == SLOW_ID, 10)
    assert SLOW_ID not in _ids(base)
    # Only the partial file is left, for a later download to resume.
    assert [p.name for p in cache.iterdir() if "slow-GGUF" in p.name and p.name.endswith(".gguf")] == []
