"""The site guard's rules (api/site_guard.py), each refusal and each request that must keep
working, with the headers a browser, curl and the SDKs really send."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from llamaserve.api.site_guard import SiteGuardMiddleware, SitePolicy, is_guarded
from llamaserve.config import ServerConfig

OPEN = SitePolicy(trusted_origins=frozenset(), allowed_hosts=frozenset(), check_host=True)
HOST = "127.0.0.1:8080"
# What Chromium sends with a fetch() from the page http://127.0.0.1:8080/ to its own server.
SAME_ORIGIN = {"host": HOST, "origin": "http://127.0.0.1:8080", "sec-fetch-site": "same-origin"}
JSON_BODY = {"content-type": "application/json"}


def refusal(headers: dict[str, str], method: str = "POST", path: str = "/tools", policy: SitePolicy = OPEN) -> str:
    return policy.refusal(method, path, headers) or ""


@pytest.mark.parametrize(
    ("method", "path", "guarded"),
    [
        ("POST", "/tools", True),
        ("GET", "/tools", True),
        ("GET", "/cors-proxy", True),
        ("POST", "/slots/0", True),
        ("POST", "/lora-adapters", True),
        ("POST", "/props", True),
        ("POST", "/models/load", True),
        ("DELETE", "/models", True),
        ("POST", "/v1/files", True),
        ("GET", "/v1/files/file-1/content", True),
        ("DELETE", "/v1/files/file-1", True),
        ("POST", "/v1/batches", True),
        ("GET", "/v1/batches", True),
        ("POST", "/v1/batches/batch_1/cancel", True),
        ("POST", "/v1/filesystem", False),
        ("GET", "/slots", False),
        ("GET", "/props", False),
        ("POST", "/v1/chat/completions", False),
        ("POST", "/completion", False),
    ],
)
def test_only_routes_that_act_on_the_machine_are_guarded(method: str, path: str, guarded: bool) -> None:
    assert is_guarded(method, path) is guarded


@pytest.mark.parametrize(
    "headers",
    [
        {"host": HOST, **JSON_BODY},  # curl -H 'Content-Type: application/json', the SDKs
        {"host": HOST},  # requests.post(data=...) with no type, a GET
        {"host": "localhost:8080", "content-type": "application/json; charset=utf-8"},
        {"host": "[::1]:8080", **JSON_BODY},
        {"host": "app.localhost:8080", **JSON_BODY},
        {"host": "192.168.1.20:8080", **JSON_BODY},  # a LAN address: no name to rebind
        {**SAME_ORIGIN, **JSON_BODY},  # the web UI on its own origin
        {"host": "localhost", "origin": "http://localhost:80", "sec-fetch-site": "same-origin", **JSON_BODY},
        {"host": HOST, "sec-fetch-site": "none", **JSON_BODY},  # typed by the user
    ],
)
def test_what_curl_the_sdks_and_the_web_ui_send_passes(headers: dict[str, str]) -> None:
    assert refusal(headers) == ""


@pytest.mark.parametrize(
    ("headers", "needle"),
    [
        # fetch("http://localhost:8080/tools", {method: "POST", body: "..."}) from another site
        ({"host": HOST, "origin": "https://evil.example", "sec-fetch-site": "cross-site"}, "Sec-Fetch-Site"),
        # the same from another port of localhost: "same-site" for the browser, another origin
        ({"host": HOST, "origin": "http://127.0.0.1:3000", "sec-fetch-site": "same-site"}, "Sec-Fetch-Site"),
        # an older browser that sends no fetch metadata still sends Origin
        ({"host": HOST, "origin": "http://127.0.0.1:3000", **JSON_BODY}, "Origin"),
        ({"host": HOST, "origin": "null", **JSON_BODY}, "Origin"),
        # a form post with enctype="text/plain" and no Origin at all
        ({"host": HOST, "content-type": "text/plain;charset=UTF-8"}, "Content-Type text/plain"),
        ({"host": HOST, "content-type": "application/x-www-form-urlencoded"}, "Content-Type"),
        ({"host": HOST, "content-type": "multipart/form-data; boundary=x"}, "Content-Type"),
        # DNS rebinding: the page's own name now resolves to 127.0.0.1, so it is "same-origin"
        (
            {"host": "evil.example:8080", "origin": "http://evil.example:8080", "sec-fetch-site": "same-origin"},
            "Host 'evil.example'",
        ),
        ({"host": "localhost.evil.example:8080", **JSON_BODY}, "Host"),
    ],
)
def test_what_a_page_of_another_site_can_send_is_refused(headers: dict[str, str], needle: str) -> None:
    assert needle in refusal(headers)


def test_a_navigation_never_opens_the_mcp_proxy() -> None:
    navigation = {"host": HOST, "sec-fetch-site": "none", "sec-fetch-mode": "navigate", "sec-fetch-dest": "document"}
    assert "navigation" not in refusal(navigation, "GET", "/tools")  # the rule is the proxy's own
    assert "never a page opened in a window" in refusal(navigation, "GET", "/cors-proxy")
    framed = {**SAME_ORIGIN, "sec-fetch-mode": "navigate", "sec-fetch-dest": "iframe"}
    assert refusal(framed, "GET", "/cors-proxy")
    fetched = {**SAME_ORIGIN, "sec-fetch-mode": "cors", "sec-fetch-dest": "empty"}
    assert refusal(fetched, "GET", "/cors-proxy") == ""


def test_the_sdks_multipart_upload_passes_but_a_foreign_pages_form_does_not() -> None:
    """POST /v1/files takes the OpenAI SDK's multipart upload; a page's form to it, from another
    site, another port or a rebound name, is refused by the other rules."""
    form = {"content-type": "multipart/form-data; boundary=abc"}
    assert refusal({"host": HOST, **form}, "POST", "/v1/files") == ""
    assert refusal({**SAME_ORIGIN, **form}, "POST", "/v1/files") == ""
    assert "Sec-Fetch-Site" in refusal(
        {"host": HOST, "origin": "https://evil.example", "sec-fetch-site": "cross-site", **form}, "POST", "/v1/files"
    )
    assert "Origin" in refusal({"host": HOST, "origin": "http://127.0.0.1:3000", **form}, "POST", "/v1/files")
    assert "Host" in refusal({"host": "evil.example:8080", **form}, "POST", "/v1/files")
    # Only the upload takes multipart: a form to create or cancel a batch is refused by its type.
    assert "takes application/json" in refusal({"host": HOST, **form}, "POST", "/v1/batches")
    assert "takes multipart/form-data" in refusal({"host": HOST, "content-type": "text/plain"}, "POST", "/v1/files")
    # A rebound page may not read the batches' outputs either.
    assert "Host" in refusal({"host": "evil.example:8080"}, "GET", "/v1/files/file-1/content")


def test_the_operator_allows_hosts_and_origins() -> None:
    config = ServerConfig(allowed_hosts=("gpu-box",), cors_origins=("https://ui.example",))
    policy = SitePolicy.from_config(config)
    assert refusal({"host": "gpu-box:8080", **JSON_BODY}, policy=policy) == ""
    assert "Host" in refusal({"host": "other-box:8080", **JSON_BODY}, policy=policy)
    listed = {"host": "gpu-box:8080", "origin": "https://ui.example", "sec-fetch-site": "same-origin", **JSON_BODY}
    assert refusal(listed, policy=policy) == ""
    anywhere = SitePolicy.from_config(ServerConfig(allowed_hosts=("*",)))
    assert refusal({"host": "anything.example", **JSON_BODY}, policy=anywhere) == ""


def test_with_an_api_key_the_host_is_not_checked_but_the_browser_rules_hold() -> None:
    keyed = SitePolicy.from_config(ServerConfig(api_keys=("k",)))
    assert refusal({"host": "llm.team.example", **JSON_BODY}, policy=keyed) == ""
    assert refusal({"host": "llm.team.example", "sec-fetch-site": "cross-site"}, policy=keyed)


def test_cors_wildcard_and_localhost_do_not_trust_other_origins() -> None:
    """`*` and `localhost` say who may read answers; neither lets a page run the tools."""
    for origins in (("*",), ("localhost",)):
        policy = SitePolicy.from_config(ServerConfig(cors_origins=origins))
        assert "Origin" in refusal({"host": HOST, "origin": "http://localhost:3000", **JSON_BODY}, policy=policy)


def run_middleware(method: str, path: str, headers: dict[str, str]) -> tuple[int, Any, bool]:
    reached = False

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal reached
        reached = True
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
    }
    asyncio.run(SiteGuardMiddleware(app, OPEN)(scope, receive, send))
    body = json.loads(sent[1]["body"]) if sent[0]["status"] != 200 else None
    return sent[0]["status"], body, reached


def test_a_refusal_is_a_403_in_llama_servers_envelope_and_the_route_never_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="llamaserve.security"):
        status, body, reached = run_middleware("POST", "/tools", {"host": HOST, "content-type": "text/plain"})
    assert status == 403 and not reached
    assert body["error"]["code"] == 403 and body["error"]["type"] == "permission_error"
    assert "Content-Type text/plain" in body["error"]["message"]
    assert "refused POST /tools from 127.0.0.1: Content-Type text/plain" in caplog.text


def test_unguarded_routes_and_preflights_pass_untouched() -> None:
    cross = {"host": HOST, "origin": "https://evil.example", "sec-fetch-site": "cross-site"}
    assert run_middleware("POST", "/v1/chat/completions", cross)[2]
    assert run_middleware("OPTIONS", "/tools", cross)[2]
