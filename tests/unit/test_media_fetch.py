"""Fetching remote media (allowed with LLAMASERVE_REMOTE_MEDIA=1): size cap, status, redirects."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llamaserve.errors import APIError
from llamaserve.serving import media

BIG = b"\0" * (media.MAX_MEDIA_BYTES + 1)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        routes = {
            "/ok.png": (200, {}, b"\x89PNG-bytes"),
            "/big.png": (200, {}, BIG),
            "/missing.png": (404, {}, b""),
            "/hop": (302, {"Location": "/ok.png"}, b""),
            "/to-file": (302, {"Location": "file:///etc/passwd"}, b""),
            "/loop": (302, {"Location": "/loop"}, b""),
        }
        status, headers, body = routes.get(self.path, (404, {}, b""))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def fetch(url: str) -> bytes:
    return asyncio.run(media._fetch(url, "messages.0.content.1"))


def test_a_fetch_returns_the_bytes_and_follows_http_redirects(origin: str) -> None:
    assert fetch(f"{origin}/ok.png") == b"\x89PNG-bytes"
    assert fetch(f"{origin}/hop") == b"\x89PNG-bytes"


@pytest.mark.parametrize(
    ("path", "needle"),
    [
        ("/big.png", "larger than"),
        ("/missing.png", "HTTP 404"),
        ("/to-file", "scheme other than http(s)"),
        ("/loop", "too many redirects"),
    ],
)
def test_a_bad_fetch_is_a_400_naming_the_part(origin: str, path: str, needle: str) -> None:
    with pytest.raises(APIError) as info:
        fetch(origin + path)
    assert info.value.status == 400
    assert info.value.message.startswith("messages.0.content.1: ") and needle in info.value.message
