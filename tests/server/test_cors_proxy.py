"""--ui-mcp-proxy: /cors-proxy relays to an http(s) target, passing on only the headers named
with the x-llama-server-proxy-header- prefix, with the target's status, headers and body, less
its cookies and under a sandboxing Content-Security-Policy; link-local and metadata targets
are refused, and so are navigations and other sites' requests (docs/security.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server, stop_server

KEY = "proxy-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Target(BaseHTTPRequestHandler):
    seen: list[dict[str, Any]] = []  # noqa: RUF012 -- shared with the test on purpose

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        Target.seen.append(
            {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
        )
        if self.path.startswith("/empty"):
            self.send_response(204)
            self.end_headers()
            return
        self.send_response(201)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Mcp-Session-Id", "s-42")
        self.send_header("Set-Cookie", "target-session=1; Path=/")
        self.end_headers()
        self.wfile.write(b"got " + body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def proxy_server(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(
        ["-m", model_path, "-c", "256", "-np", "1", "--no-webui", "--ui-mcp-proxy", "--api-key", KEY],
        tmp_path_factory.mktemp("proxy"),
    )
    yield srv
    stop_server(srv)


def test_relays_status_headers_body_and_only_the_named_headers(proxy_server: RunningServer, target: str) -> None:
    headers = {
        **AUTH,
        "Cookie": "session=secret",
        "x-llama-server-proxy-header-authorization": "Bearer for-the-target",
        "x-llama-server-proxy-header-accept": "text/event-stream",
    }
    res = httpx.post(
        f"{proxy_server.url}/cors-proxy", params={"url": f"{target}/mcp"}, content=b"ping", headers=headers
    )
    assert res.status_code == 201 and res.text == "got ping"
    assert res.headers["mcp-session-id"] == "s-42"
    # What it serves runs nothing on our origin and sets no cookie there.
    assert "set-cookie" not in res.headers
    assert res.headers["content-security-policy"] == "sandbox; default-src 'none'"
    assert res.headers["x-content-type-options"] == "nosniff"
    seen = Target.seen[-1]
    assert seen["path"] == "/mcp" and seen["body"] == b"ping"
    assert seen["headers"]["authorization"] == "Bearer for-the-target"
    assert seen["headers"]["accept"] == "text/event-stream"
    assert "cookie" not in seen["headers"]
    assert not any(k.startswith("x-llama-server") for k in seen["headers"])
    empty = httpx.post(f"{proxy_server.url}/cors-proxy", params={"url": f"{target}/empty"}, headers=AUTH)
    assert empty.status_code == 204 and empty.content == b""


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://127.0.0.1/x", "unsupported URL scheme"),
        ("http:///nohost", "missing host"),
        ("http://user:pw@127.0.0.1/", "authentication in target URL"),
    ],
)
def test_refuses_bad_targets(proxy_server: RunningServer, url: str, message: str) -> None:
    res = httpx.get(f"{proxy_server.url}/cors-proxy", params={"url": url}, headers=AUTH)
    assert res.status_code == 400 and message in res.json()["error"]["message"]


def test_needs_the_key_and_grants_cors_to_localhost_only(proxy_server: RunningServer, target: str) -> None:
    assert httpx.get(f"{proxy_server.url}/cors-proxy", params={"url": target}).status_code == 401
    preflight = {"Access-Control-Request-Method": "GET"}
    evil = httpx.options(f"{proxy_server.url}/cors-proxy", headers={"Origin": "http://evil.example", **preflight})
    assert "access-control-allow-origin" not in evil.headers
    local = httpx.options(f"{proxy_server.url}/cors-proxy", headers={"Origin": "http://127.0.0.1:3000", **preflight})
    assert local.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"


def test_without_the_flag_proxy_and_tools_are_403(server: RunningServer) -> None:
    for path in ("/cors-proxy?url=http://127.0.0.1/", "/tools"):
        res = httpx.get(f"{server.url}{path}")
        assert res.status_code == 403 and res.json()["error"]["message"] == "this feature is disabled"


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
        ("http://169.254.1.1/", "a link-local address"),
        ("http://[fe80::1]/", "a link-local address"),
        ("http://100.100.100.200/", "a cloud metadata address"),
    ],
)
def test_never_reaches_link_local_or_metadata_addresses(proxy_server: RunningServer, url: str, needle: str) -> None:
    res = httpx.get(f"{proxy_server.url}/cors-proxy", params={"url": url}, headers=AUTH)
    assert res.status_code == 403 and needle in res.json()["error"]["message"]


@pytest.mark.parametrize(
    "browser",
    [
        {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},
        {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"},
        {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"},
    ],
)
def test_a_window_or_frame_opened_on_the_proxy_is_refused(
    proxy_server: RunningServer, target: str, browser: dict[str, str]
) -> None:
    res = httpx.get(f"{proxy_server.url}/cors-proxy", params={"url": target}, headers={**AUTH, **browser})
    assert res.status_code == 403 and res.json()["error"]["type"] == "permission_error"
    fetched = {"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}
    assert httpx.get(f"{proxy_server.url}/cors-proxy", params={"url": target}, headers={**AUTH, **fetched}).is_success
