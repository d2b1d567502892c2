"""Fetching remote media (allowed with LLAMASERVE_REMOTE_MEDIA=1): size cap, status, redirects,
and the addresses a fetch may reach at each hop (loopback and private ones only with
LLAMASERVE_REMOTE_MEDIA=private, link-local and metadata ones never)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llamaserve.errors import APIError
from llamaserve.outbound import MEDIA_PUBLIC_ONLY, MEDIA_WITH_PRIVATE, Reach, pinned_request_args
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
            "/to-metadata": (302, {"Location": "http://169.254.169.254/latest/meta-data/"}, b""),
            "/to-localhost": (302, {"Location": f"http://localhost:{self.server.server_address[1]}/ok.png"}, b""),
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


def fetch(url: str, reach: Reach = MEDIA_WITH_PRIVATE) -> bytes:
    """The test's origin is on 127.0.0.1: these fetches run as LLAMASERVE_REMOTE_MEDIA=private."""
    return asyncio.run(media._fetch(url, "messages.0.content.1", reach))


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


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://127.0.0.1:9/x.png", "127.0.0.1 is a loopback address"),
        ("http://localhost:9/x.png", "a loopback address"),
        ("http://[::ffff:127.0.0.1]:9/x.png", "a loopback address"),
        ("http://10.1.2.3/x.png", "a private address"),
        ("http://192.168.0.1/x.png", "a private address"),
        ("http://169.254.169.254/latest/meta-data/", "a cloud metadata address"),
        ("http://[fe80::1]/x.png", "a link-local address"),
    ],
)
def test_by_default_a_fetch_reaches_public_addresses_only(url: str, needle: str) -> None:
    with pytest.raises(APIError) as info:
        fetch(url, MEDIA_PUBLIC_ONLY)
    assert info.value.status == 400 and "the media URL is refused" in info.value.message
    assert needle in info.value.message


def test_each_redirect_hop_is_checked_again(origin: str) -> None:
    with pytest.raises(APIError) as info:
        fetch(f"{origin}/to-metadata")
    assert "169.254.169.254 is a cloud metadata address" in info.value.message
    # A hop to a loopback name is followed where private reach is allowed.
    assert fetch(f"{origin}/to-localhost") == b"\x89PNG-bytes"


def test_a_fetch_connects_to_the_checked_address_but_speaks_to_the_name() -> None:
    url, headers, extensions = pinned_request_args("https://media.example:8443/a.png?x=1", "203.0.113.7")
    assert url == "https://203.0.113.7:8443/a.png?x=1"
    assert headers == {"host": "media.example:8443"} and extensions == {"sni_hostname": "media.example"}
    url, headers, extensions = pinned_request_args("http://media.example/a.png", "2001:db8::1")
    assert url == "http://[2001:db8::1]/a.png" and headers == {"host": "media.example"} and extensions == {}


def test_metadata_and_link_local_stay_refused_with_private_reach() -> None:
    for url in ("http://169.254.169.254/", "http://169.254.10.1/", "http://[fd00:ec2::254]/"):
        with pytest.raises(APIError, match=r"metadata|link-local"):
            fetch(url, MEDIA_WITH_PRIVATE)
