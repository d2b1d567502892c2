"""llama-server's CORS rules (api/cors.py) without a server: every --cors-origins form."""

from __future__ import annotations

import pytest

from llamaserve.api.cors import CorsPolicy, origin_is_localhost
from llamaserve.api.header_case import respell_headers


def policy(origins: tuple[str, ...] = ("*",), credentials: bool = True) -> CorsPolicy:
    return CorsPolicy(origins=origins, methods="GET, POST", headers="*", credentials=credentials)


def test_star_reflects_with_credentials_and_is_a_star_without() -> None:
    assert policy().allow_origin("https://a.example") == "https://a.example"
    assert policy().allow_origin(None) is None
    assert policy(credentials=False).allow_origin("https://a.example") == "*"


def test_a_list_allows_exactly_its_origins() -> None:
    listed = policy(("https://a.example", "http://b.example:3000"))
    assert listed.allow_origin("http://b.example:3000") == "http://b.example:3000"
    assert listed.allow_origin("https://a.example") == "https://a.example"
    for other in ("http://a.example", "https://a.example:443", "https://a.example.evil", None):
        assert listed.allow_origin(other) is None


@pytest.mark.parametrize(
    ("origin", "local"),
    [
        ("http://localhost", True),
        ("https://localhost:5173", True),
        ("http://127.0.0.1:3000", True),
        ("http://[::1]", True),
        ("http://localhost.evil.com", False),
        ("http://notlocalhost", False),
        ("http://127.0.0.1.evil.com", False),
        ("http://localhost@evil.com", False),
        ("file://localhost", False),
        ("localhost", False),
        ("http://[::1", False),
    ],
)
def test_localhost_means_loopback_hosts_only(origin: str, local: bool) -> None:
    assert origin_is_localhost(origin) is local
    assert policy(("localhost",)).allow_origin(origin) == (origin if local else None)


def test_preflight_headers_are_llama_servers_four() -> None:
    headers = dict(policy(credentials=False).preflight_headers("https://a.example"))
    assert headers == {
        b"Access-Control-Allow-Origin": b"*",
        b"Access-Control-Allow-Credentials": b"false",
        b"Access-Control-Allow-Methods": b"GET, POST",
        b"Access-Control-Allow-Headers": b"*",
        b"Content-Type": b"text/html",
        b"Content-Length": b"0",
    }


def test_cors_names_are_respelled_in_the_header_block_only() -> None:
    head = b"HTTP/1.1 200 OK\r\naccess-control-allow-origin: x\r\ncontent-type: text/html\r\n\r\n"
    out = respell_headers(head + b"\r\naccess-control-allow-origin: body")
    assert out == (
        b"HTTP/1.1 200 OK\r\nAccess-Control-Allow-Origin: x\r\ncontent-type: text/html\r\n\r\n"
        b"\r\naccess-control-allow-origin: body"
    )
    assert respell_headers(b"\r\naccess-control-allow-origin: x") == b"\r\naccess-control-allow-origin: x"
