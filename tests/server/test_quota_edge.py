"""--api-keys-config at the edge: the router and the `--upstreams` front hold the keys and their
limits; the servers behind them (a router's children, the front's members) hold none and report
what each request used, so the edge counts and charges it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import RunningServer, start_server, stop_server
from tests.server.test_quota import abandon_stream, wait_for

SAM, OPS, PAT, KIM = "sk-sam-r0uter", "sk-ops-r0uter", "sk-pat-fr0nt", "sk-kim-fr0nt"
CONFIG = f"""
[[keys]]
name = "sam"
key = "{SAM}"
models = ["smol"]
requests_per_minute = 3

[[keys]]
name = "pat"
key = "{PAT}"
tokens_per_minute = 30

[[keys]]
name = "kim"
key = "{KIM}"
tokens_per_minute = 100

[[keys]]
name = "ops"
key = "{OPS}"
admin = true
"""
HI = [{"role": "user", "content": "Hi"}]


def _keys(tmp: Path) -> list[str]:
    (tmp / "keys.toml").write_text(CONFIG)
    return ["--api-keys-config", str(tmp / "keys.toml"), "--usage-db", str(tmp / "usage.sqlite3"), "--metrics"]


@pytest.fixture(scope="module")
def router(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("quota-router")
    models = tmp / "models"
    models.mkdir()
    (models / "smol.gguf").symlink_to(model_path)
    args = ["--models-dir", str(models), "-t", "2", "-np", "2", "-c", "2048", "--temp", "0", *_keys(tmp)]
    srv = start_server(args, tmp, env={"LLAMA_CACHE": str(tmp / "cache")})
    yield srv
    stop_server(srv)


def _post(url: str, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=180)


def _usage(url: str) -> dict[tuple[str, str], dict[str, Any]]:
    rows = httpx.get(f"{url}/usage", headers={"Authorization": f"Bearer {OPS}"}, timeout=30).json()["data"]
    return {(r["key"], r["model"]): r for r in rows}


def test_router_a_model_not_allowed_is_403_the_allowed_one_is_counted_and_limited(router: RunningServer) -> None:
    url = router.url
    chat = {"model": "coder", "messages": HI, "max_tokens": 3}
    refused = _post(url, "/v1/chat/completions", SAM, chat)
    assert refused.status_code == 403
    assert refused.json()["error"]["type"] == "permission_error"
    assert "may not use model 'coder'" in refused.json()["error"]["message"]
    claude = _post(url, "/v1/messages", SAM, chat)
    assert claude.status_code == 403 and claude.json()["error"]["type"] == "permission_error"

    whole = _post(url, "/v1/chat/completions", SAM, {**chat, "model": "smol"})
    assert whole.status_code == 200, whole.text
    used = [whole.json()["usage"]]
    body = {**chat, "model": "smol", "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {SAM}"}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=180) as answer:
        assert answer.status_code == 200
        assert "x-llamaserve-usage" not in answer.headers
        text = answer.read().decode()
    assert "llamaserve-usage" not in text  # the server's report stops at the router
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    used.append(next(e["usage"] for e in events if e.get("usage")))

    row = _usage(url)[("sam", "smol")]
    assert row["requests"] == 2 and row["errors"] == 0
    assert row["prompt_tokens"] == sum(u["prompt_tokens"] for u in used)
    assert row["completion_tokens"] == sum(u["completion_tokens"] for u in used)
    assert _usage(url)[("sam", "coder")]["errors"] == 2

    # The third request of the minute passes, the fourth is refused at the router.
    assert _post(url, "/v1/chat/completions", SAM, {**chat, "model": "smol"}).status_code == 200
    over = _post(url, "/v1/chat/completions", SAM, {**chat, "model": "smol"})
    assert over.status_code == 429 and "requests_per_minute" in over.json()["error"]["message"]
    assert int(over.headers["retry-after"]) >= 1

    metrics = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {OPS}"}, timeout=30).text
    assert 'llamaserve:key_completion_tokens_total{key="sam",model="smol"}' in metrics
    assert SAM not in metrics and OPS not in metrics


def test_front_charges_what_its_member_reports(model_path: str, tmp_path: Path) -> None:
    member = start_server(["-m", model_path, "-t", "2", "-np", "2", "-c", "2048", "--temp", "0"], tmp_path)
    try:
        front = start_server(["--upstreams", member.url, *_keys(tmp_path)], tmp_path)
        try:
            first = _post(front.url, "/v1/chat/completions", PAT, {"messages": HI, "max_tokens": 3})
            assert first.status_code == 200
            assert "x-llamaserve-usage" not in first.headers
            used = first.json()["usage"]
            over = _post(front.url, "/v1/messages", PAT, {"model": "x", "messages": HI, "max_tokens": 3})
            assert over.status_code == 429, over.text
            assert over.json()["error"]["type"] == "rate_limit_error"
            assert "tokens_per_minute" in over.json()["error"]["message"]
            rows = [r for (key, _), r in _usage(front.url).items() if key == "pat"]
            assert sum(r["prompt_tokens"] for r in rows) == used["prompt_tokens"]
            assert sum(r["completion_tokens"] for r in rows) == used["completion_tokens"]
            # A stream whose client leaves midway is charged at the front what it streamed.
            abandon_stream(front.url, {"Authorization": f"Bearer {KIM}"}, 120)
            kim = lambda: sum(r["completion_tokens"] for (k, _), r in _usage(front.url).items() if k == "kim")  # noqa: E731
            wait_for(lambda: kim() >= 120)
            late = _post(front.url, "/v1/chat/completions", KIM, {"messages": HI, "max_tokens": 3})
            assert late.status_code == 429 and "tokens_per_minute" in late.text
            # The member holds no keys file: it counted nothing and refuses nothing.
            assert httpx.get(f"{member.url}/usage", timeout=30).status_code == 404
        finally:
            stop_server(front)
    finally:
        stop_server(member)
