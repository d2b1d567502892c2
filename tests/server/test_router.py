"""Router mode with two real models: SmolLM2-135M and Qwen2.5-Coder-0.5B, each in its own process.

One router (`--models-max 2`, a models folder and a preset) serves most tests; a second one
with `--models-max 1` and an API key shows the swap, the key check and that the children
die with the router; a third with `--models-memory-max` evicts by measured memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.models.packaged import qwen_coder
from tests.server.conftest import RunningServer, start_server, stop_server

SMOL = "smol"
CODER = "qwen-coder"
PROMPT = [{"role": "user", "content": "Name three colors."}]
COMMON = ["-t", "2", "-np", "4", "--temp", "0", "-n", "5"]


def _catalog(tmp: Path, model_path: str, extra_ini: str = "") -> tuple[Path, Path]:
    models = tmp / "models"
    models.mkdir()
    (models / f"{SMOL}.gguf").symlink_to(model_path)
    preset = tmp / "presets.ini"
    preset.write_text(
        "version = 1\n\n[*]\nctx-size = 1024\n\n"
        f"[{CODER}]\nmodel = {qwen_coder()}\nctx-size = 2048\nalias = coder\nstop-timeout = 5\n" + extra_ini
    )
    return models, preset


def _router(tmp: Path, args: list[str]) -> RunningServer:
    # An empty download cache: the listed models are exactly the folder's and the preset's.
    env = {"LLAMA_CACHE": str(tmp / "cache")}
    return start_server([*args, *COMMON], tmp, env=env)


@pytest.fixture(scope="module")
def router(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("router")
    bad = tmp / "broken.gguf"
    bad.write_text("not a model")
    models, preset = _catalog(tmp, model_path, f"\n[broken]\nmodel = {bad}\n")
    srv = _router(tmp, ["--models-dir", str(models), "--models-preset", str(preset), "--models-max", "2", "--metrics"])
    yield srv
    stop_server(srv)


def _models(url: str, headers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    body = httpx.get(f"{url}/models", headers=headers, timeout=10).json()
    return {m["id"]: m for m in body["data"]}


def _chat(url: str, model: str, headers: dict[str, str] | None = None, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": PROMPT, "max_tokens": 5, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=180)


def _loaded(url: str, *names: str) -> None:
    """Each model loaded (through /models/load when it is not), without a generation."""
    for name in names:
        if _models(url)[name]["status"]["value"] != "loaded":
            httpx.post(f"{url}/models/load", json={"model": name}, timeout=30)
        deadline = time.time() + 120
        while _models(url)[name]["status"]["value"] != "loaded":
            assert time.time() < deadline, f"{name} did not load"
            time.sleep(0.1)


def _child_port(url: str, model: str) -> int:
    args = _models(url)[model]["status"]["args"]
    return int(args[args.index("--port") + 1])


def _child_pid(port: int) -> int:
    """The process listening as a router child on `port` (found by its command line)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"llamaserve" in b" ".join(argv)
            and b"--port" in argv
            and argv[argv.index(b"--port") + 1] == str(port).encode()
        ):
            return int(entry.name)
    raise AssertionError(f"no child process on port {port}")


def _stream_lines(response: httpx.Response) -> Iterator[str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: ") :]


def test_each_request_is_answered_by_the_model_it_names(router: RunningServer, model_path: str, tmp_path: Path) -> None:
    smol = _chat(router.url, SMOL)
    coder = _chat(router.url, "coder")  # the preset's alias
    assert smol.status_code == 200 and coder.status_code == 200, (smol.text, coder.text)
    assert smol.json()["model"] == SMOL
    assert coder.json()["model"] == CODER
    text_smol = smol.json()["choices"][0]["message"]["content"]
    text_coder = coder.json()["choices"][0]["message"]["content"]
    assert text_smol and text_coder and text_smol != text_coder
    # The same request to each model's own process gives the same text: the router changes nothing.
    for name, text in ((SMOL, text_smol), (CODER, text_coder)):
        direct = _chat(f"http://127.0.0.1:{_child_port(router.url, name)}", name)
        assert direct.json()["choices"][0]["message"]["content"] == text


def test_preset_sets_context_size_and_alias_seen_in_models(router: RunningServer) -> None:
    _loaded(router.url, CODER, SMOL)
    listed = _models(router.url)
    coder = listed[CODER]
    assert coder["aliases"] == ["coder"]
    assert coder["source"] == "preset"
    assert coder["status"]["value"] == "loaded"
    assert "ctx-size = 2048" in coder["status"]["preset"]
    assert coder["meta"]["n_ctx"] == 2048 // 4  # what the running child reports: each of -np 4 slots a quarter
    assert listed[SMOL]["source"] == "models_dir"
    args = listed[SMOL]["status"]["args"]
    assert args[args.index("-c") + 1] == "1024"  # from the [*] section
    same = httpx.get(f"{router.url}/v1/models", timeout=10).json()
    assert {m["id"] for m in same["data"]} == set(listed)


def test_unknown_or_missing_model_is_a_400_naming_it(router: RunningServer) -> None:
    res = _chat(router.url, "no-such-model")
    assert res.status_code == 400
    err = res.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400
    assert "no-such-model" in err["message"]
    missing = httpx.post(f"{router.url}/v1/completions", json={"prompt": "hi"}, timeout=10)
    assert missing.status_code == 400 and "model name is missing" in missing.json()["error"]["message"]
    load = httpx.post(f"{router.url}/models/load", json={"model": "no-such-model"}, timeout=10)
    assert load.status_code == 404 and load.json()["error"]["message"] == "model is not found"


def test_the_router_refuses_what_another_sites_page_could_send(router: RunningServer) -> None:
    """The site guard stands at the router's edge (docs/security.md): a text/plain load, a
    foreign origin and a rebound Host never load a model; the web UI's own request, judged
    at the edge, is not refused again by the child behind it."""
    body = json.dumps({"model": CODER})
    foreign = [
        {"Content-Type": "text/plain"},
        {"Content-Type": "application/json", "Origin": "http://localhost:3000", "Sec-Fetch-Site": "same-site"},
        {"Content-Type": "application/json", "Host": "rebound.example"},
    ]
    for headers in foreign:
        res = httpx.post(f"{router.url}/models/load", content=body, headers=headers, timeout=10)
        assert res.status_code == 403 and res.json()["error"]["type"] == "permission_error", res.text
    _loaded(router.url, SMOL)
    own = {"Origin": router.url, "Sec-Fetch-Site": "same-origin"}
    res = httpx.post(f"{router.url}/slots/0?action=erase&model={SMOL}", json={"model": SMOL}, headers=own, timeout=30)
    # The child answers for itself: it has no --slot-save-path here.
    assert res.status_code == 501 and "--slot-save-path" in res.json()["error"]["message"], res.text


def test_the_other_api_families_go_through_the_router(router: RunningServer) -> None:
    _loaded(router.url, SMOL)
    msg = {"model": SMOL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    anthropic = httpx.post(f"{router.url}/v1/messages", json=msg, timeout=120)
    assert anthropic.status_code == 200 and anthropic.json()["type"] == "message"
    responses = httpx.post(
        f"{router.url}/v1/responses", json={"model": SMOL, "input": "Hi", "max_output_tokens": 4}, timeout=120
    )
    assert responses.status_code == 200 and responses.json()["object"] == "response"
    tokens = httpx.post(f"{router.url}/tokenize", json={"model": SMOL, "content": "hello world"}, timeout=30)
    assert tokens.status_code == 200 and tokens.json()["tokens"]
    # A multipart body names its model in a form field.
    form = httpx.post(f"{router.url}/tokenize", data={"model": "nobody"}, files={"f": b"x"}, timeout=30)
    assert form.status_code == 400 and "nobody" in form.json()["error"]["message"]
    unknown = httpx.post(f"{router.url}/v1/messages", json={**msg, "model": "nobody"}, timeout=30)
    assert unknown.status_code == 400
    assert unknown.json()["type"] == "error" and "nobody" in unknown.json()["error"]["message"]


def test_eight_concurrent_streams_over_both_models_complete(router: RunningServer) -> None:
    def stream(i: int) -> tuple[str, list[str], str]:
        name = (SMOL, CODER)[i % 2]
        body = {"model": name, "messages": PROMPT, "max_tokens": 4, "stream": True}
        with httpx.stream("POST", f"{router.url}/v1/chat/completions", json=body, timeout=300) as res:
            lines = list(_stream_lines(res))
        return name, lines, res.headers.get("content-type", "")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(stream, range(8)))
    for name, lines, ctype in results:
        assert ctype.startswith("text/event-stream")
        assert lines[-1] == "[DONE]"
        chunks = [json.loads(line) for line in lines[:-1]]
        assert {c["model"] for c in chunks} == {name}
        assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_client_that_leaves_frees_the_childs_slot(router: RunningServer) -> None:
    _loaded(router.url, SMOL)
    child = f"http://127.0.0.1:{_child_port(router.url, SMOL)}"
    body = {"model": SMOL, "prompt": "Count:", "n_predict": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{router.url}/completion", json=body, timeout=60) as res:
        for seen, _ in enumerate(_stream_lines(res), 1):
            if seen == 3:
                break
    deadline = time.time() + 20
    while time.time() < deadline:
        slots = httpx.get(f"{child}/slots", timeout=10).json()
        if not any(s["is_processing"] for s in slots):
            break
        time.sleep(0.2)
    assert not any(s["is_processing"] for s in slots)


def test_a_child_killed_mid_stream_ends_that_stream_with_an_error_and_reloads(router: RunningServer) -> None:
    _loaded(router.url, SMOL, CODER)
    pid = _child_pid(_child_port(router.url, SMOL))
    other: list[int] = []
    body = {"model": SMOL, "prompt": "Count:", "n_predict": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{router.url}/completion", json=body, timeout=60) as res:
        lines = _stream_lines(res)
        first = json.loads(next(lines))
        assert "content" in first
        os.kill(pid, signal.SIGKILL)
        # The other model keeps serving while this one is down.
        thread = threading.Thread(target=lambda: other.append(_chat(router.url, CODER).status_code))
        thread.start()
        rest = list(lines)
    assert rest, "the stream ended without a word"
    last = json.loads(rest[-1])
    assert "error" in last and last["error"]["type"] == "server_error"
    thread.join(120)
    assert other == [200]
    status = _models(router.url)[SMOL]["status"]
    assert status["value"] == "unloaded" and status["failed"] is True and status["exit_code"] == -signal.SIGKILL
    again = _chat(router.url, SMOL)
    assert again.status_code == 200 and again.json()["model"] == SMOL
    assert _models(router.url)[SMOL]["status"]["value"] == "loaded"


def test_a_failed_load_reports_its_exit_code_and_log_and_retries_only_when_asked(router: RunningServer) -> None:
    res = _chat(router.url, "broken")
    assert res.status_code == 503
    assert "failed to load" in res.json()["error"]["message"]
    status = _models(router.url)["broken"]["status"]
    assert status["value"] == "unloaded" and status["failed"] is True and status["exit_code"] == 1
    assert any("broken.gguf" in line or "model" in line for line in status["log_tail"])
    time.sleep(1)
    assert _models(router.url)["broken"]["status"]["value"] == "unloaded"  # no retry on its own
    assert _chat(router.url, "broken").status_code == 503  # asked again: tried again


def test_metrics_are_labelled_by_model_and_props_routes_by_query(router: RunningServer) -> None:
    _loaded(router.url, SMOL, CODER)
    text = httpx.get(f"{router.url}/metrics", timeout=30).text
    assert f'llamacpp:tokens_predicted_total{{model="{SMOL}"}}' in text
    assert f'llamacpp:tokens_predicted_total{{model="{CODER}"}}' in text
    assert text.count("# TYPE llamacpp:tokens_predicted_total ") == 1
    props = httpx.get(f"{router.url}/props", params={"model": "coder"}, timeout=30).json()
    assert props["model_alias"] == CODER
    own = httpx.get(f"{router.url}/props", timeout=10).json()
    assert own["role"] == "router" and own["max_instances"] == 2


KEY = {"Authorization": "Bearer sk-router"}


def _events(url: str, out: list[dict[str, Any]], ready: threading.Event, stop: threading.Event) -> None:
    url = f"{url}/models/sse"
    with contextlib.suppress(httpx.HTTPError), httpx.stream("GET", url, headers=KEY, timeout=None) as res:
        ready.set()
        for line in res.iter_lines():
            if stop.is_set():
                return
            if line.startswith("data: "):
                out.append(json.loads(line[len("data: ") :]))


def test_models_max_1_swaps_models_and_the_states_follow_in_order(model_path: str, tmp_path: Path) -> None:
    models, preset = _catalog(tmp_path, model_path)
    args = ["--models-dir", str(models), "--models-preset", str(preset), "--models-max", "1", "--api-key", "sk-router"]
    srv = _router(tmp_path, args)
    try:
        assert _chat(srv.url, SMOL).status_code == 401  # the key is checked at the router
        assert _chat(srv.url, SMOL, headers=KEY).json()["model"] == SMOL
        # The child itself has no key: the router checked it once.
        assert _chat(f"http://127.0.0.1:{_child_port_keyed(srv.url, SMOL)}", SMOL).status_code == 200
        listed = _models(srv.url, KEY)
        assert (listed[SMOL]["status"]["value"], listed[CODER]["status"]["value"]) == ("loaded", "unloaded")
        events: list[dict[str, Any]] = []
        ready, stop = threading.Event(), threading.Event()
        threading.Thread(target=_events, args=(srv.url, events, ready, stop), daemon=True).start()
        assert ready.wait(10)
        assert _chat(srv.url, CODER, headers=KEY).json()["model"] == CODER
        listed = _models(srv.url, KEY)
        assert (listed[SMOL]["status"]["value"], listed[CODER]["status"]["value"]) == ("unloaded", "loaded")
        time.sleep(0.5)
        stop.set()
        seen = [(e["model"], e["data"]["status"]) for e in events if e["event"] == "model_status"]
        # SmolLM2 goes before Qwen starts: never two models at once.
        assert seen == [(SMOL, "unloaded"), (CODER, "loading"), (CODER, "loaded")]
        pid = _child_pid(_child_port_keyed(srv.url, CODER))
    finally:
        srv.process.kill()  # SIGKILL: the router cannot stop its children itself
        srv.process.wait(10)
    # The child sees its stdin close and exits on its own.
    deadline = time.time() + 30
    while time.time() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def _child_port_keyed(url: str, model: str) -> int:
    args = _models(url, KEY)[model]["status"]["args"]
    return int(args[args.index("--port") + 1])


def test_models_memory_max_evicts_by_measured_memory(model_path: str, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("first", "second"):
        (models / f"{name}.gguf").symlink_to(model_path)
    # No count limit; 64 MiB is less than one model uses, so a second model pushes the first out.
    srv = _router(tmp_path, ["--models-dir", str(models), "--models-max", "0", "--models-memory-max", "64"])
    try:
        assert _chat(srv.url, "first").status_code == 200
        assert _chat(srv.url, "second").status_code == 200
        listed = _models(srv.url)
        assert (listed["first"]["status"]["value"], listed["second"]["status"]["value"]) == ("unloaded", "loaded")
    finally:
        stop_server(srv)
