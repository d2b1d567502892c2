"""Operator-facing behaviour: keys, CORS, limits, metrics, logs, TLS, bad inputs."""

from __future__ import annotations

import json
import random
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from .conftest import RunningServer, start_server, stop_server

KEY = "sk-test-123"


@pytest.fixture(scope="module")
def guarded(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("guarded")
    log_file = tmp / "server.log"
    srv = start_server(
        [
            "-m",
            model_path,
            "-np",
            "2",
            "-c",
            "2048",
            "-t",
            "2",
            "--api-key",
            f"other,{KEY}",
            "--metrics",
            "--no-slots",
            "--body-limit",
            "1",
            "--log-file",
            str(log_file),
            "--chat-template",
            "{{ raise_exception('this template refuses everything') }}",
        ],
        tmp,
    )
    yield srv, log_file
    stop_server(srv)


def test_every_route_but_health_needs_a_key(guarded: tuple[RunningServer, Path]) -> None:
    url = guarded[0].url
    assert httpx.get(f"{url}/health").status_code == 200
    for method, path in (
        ("GET", "/v1/models"),
        ("GET", "/props"),
        ("POST", "/completion"),
        ("GET", "/metrics"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/tokenize"),
    ):
        r = httpx.request(method, f"{url}{path}", json={})
        assert r.status_code == 401, path
        assert r.json()["error"]["type"] == "authentication_error"
        wrong = httpx.request(method, f"{url}{path}", json={}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
    ok_bearer = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    ok_header = httpx.get(f"{url}/v1/models", headers={"x-api-key": "other"})
    assert ok_bearer.status_code == 200 and ok_header.status_code == 200


def test_openai_sdk_with_key(guarded: tuple[RunningServer, Path]) -> None:
    good = openai.OpenAI(base_url=f"{guarded[0].url}/v1", api_key=KEY, max_retries=0)
    r = good.completions.create(model="m", prompt="Hello", max_tokens=2)
    assert r.choices[0].text is not None
    bad = openai.OpenAI(base_url=f"{guarded[0].url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="m", prompt="Hello", max_tokens=2)


def test_cors_preflight_reflects_the_origin_with_credentials_by_default(guarded: tuple[RunningServer, Path]) -> None:
    """llama-server's default: any Origin is reflected and credentials are allowed; the
    preflight is answered before the key check (browsers send it without the key)."""
    r = httpx.options(
        f"{guarded[0].url}/v1/chat/completions",
        headers={
            "Origin": "https://evil.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert r.status_code == 200
    assert r.headers.get("access-control-allow-origin") == "https://evil.example"
    assert r.headers.get("access-control-allow-credentials") == "true"


def test_body_limit_is_413_with_the_limit(guarded: tuple[RunningServer, Path]) -> None:
    body = json.dumps({"prompt": "a" * (2 * 1024 * 1024)}).encode()
    r = httpx.post(
        f"{guarded[0].url}/completion",
        content=body,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 413
    assert str(1024 * 1024) in r.json()["error"]["message"]


def test_slots_endpoint_can_be_disabled(guarded: tuple[RunningServer, Path]) -> None:
    r = httpx.get(f"{guarded[0].url}/slots", headers={"x-api-key": KEY})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


def test_template_exception_is_a_400_with_its_message(guarded: tuple[RunningServer, Path]) -> None:
    r = httpx.post(
        f"{guarded[0].url}/v1/chat/completions",
        headers={"x-api-key": KEY},
        timeout=30,
        json={"messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400
    assert "this template refuses everything" in r.json()["error"]["message"]


def metric_values(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_have_llama_server_names_and_move(guarded: tuple[RunningServer, Path]) -> None:
    url, headers = guarded[0].url, {"x-api-key": KEY}
    before = httpx.get(f"{url}/metrics", headers=headers)
    assert before.headers["content-type"].startswith("text/plain")
    for name in (
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:prompt_seconds_total",
        "llamacpp:tokens_predicted_seconds_total",
        "llamacpp:n_decode_total",
        "llamacpp:n_busy_slots_per_decode",
        "llamacpp:prompt_tokens_seconds",
        "llamacpp:predicted_tokens_seconds",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:n_tokens_max",
        "llamaserve:time_to_first_token_seconds_count",
        "llamaserve:inter_token_latency_seconds_count",
        "llamaserve:request_duration_seconds_count",
    ):
        assert f"# TYPE {name.removesuffix('_count')}" in before.text or name in before.text, name
    b = metric_values(before.text)
    httpx.post(
        f"{url}/completion",
        headers=headers,
        timeout=60,
        json={"prompt": "Count to five:", "n_predict": 5, "ignore_eos": True},
    )
    a = metric_values(httpx.get(f"{url}/metrics", headers=headers).text)
    assert a["llamacpp:tokens_predicted_total"] == b["llamacpp:tokens_predicted_total"] + 5
    assert a["llamacpp:prompt_tokens_total"] > b["llamacpp:prompt_tokens_total"]
    assert a["llamacpp:n_decode_total"] >= b["llamacpp:n_decode_total"] + 5
    assert a["llamaserve:time_to_first_token_seconds_count"] == b["llamaserve:time_to_first_token_seconds_count"] + 1
    assert a["llamaserve:request_duration_seconds_count"] == b["llamaserve:request_duration_seconds_count"] + 1


def test_access_log_lines_go_to_the_log_file(guarded: tuple[RunningServer, Path]) -> None:
    url, log_file = guarded
    httpx.post(f"{url.url}/completion", headers={"x-api-key": KEY}, json={"prompt": "Hi", "n_predict": 2}, timeout=60)
    time.sleep(0.2)
    lines = log_file.read_text().splitlines()
    hits = [ln for ln in lines if "POST /completion 200" in ln]
    assert hits and "predicted=2" in hits[-1]
    assert any("GET /v1/models 401" in ln for ln in lines)


def test_tls(model_path: str, tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    port_srv = None
    try:
        port_srv = start_server(
            ["-m", model_path, "-np", "1", "-c", "512", "--ssl-key-file", str(key), "--ssl-cert-file", str(cert)],
            tmp_path,
            ready_scheme="https",
        )
        url = port_srv.url.replace("http://", "https://")
        verify = ssl.create_default_context(cafile=str(cert))
        r = httpx.get(f"{url}/health", verify=verify)
        assert r.status_code == 200
        # A stream's middle chunks skip the middleware (api/direct_body.py); over TLS they must
        # still pass through the encryption, not straight to the socket.
        body = {"prompt": "Once upon a time", "n_predict": 6, "stream": True, "temperature": 0}
        with httpx.stream("POST", f"{url}/completion", json=body, verify=verify, timeout=60) as streamed:
            events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: ")]
        assert streamed.status_code == 200
        assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] == 6
        assert sum(1 for e in events if e.get("content")) >= 2
    finally:
        if port_srv is not None:
            stop_server(port_srv)


# ------------------------------------------------------------- bad inputs
def test_utf8_is_never_broken_in_a_stream(base_url: str) -> None:
    """R9: byte-fallback tokens and cut-offs mid-character never produce invalid UTF-8."""
    prompt = "Répète ces emoji et caractères: 😀🎉🚀 日本語の文章 한국어 " * 3
    for n_predict in (1, 2, 3, 7, 16):
        with httpx.stream(
            "POST",
            f"{base_url}/completion",
            timeout=60,
            json={"prompt": prompt, "n_predict": n_predict, "stream": True, "temperature": 0},
        ) as r:
            raw = b"".join(r.iter_bytes())
        text = raw.decode("utf-8")  # strict: raises on a broken sequence
        parts = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ")]
        assert all("\ufffd" not in p["content"] for p in parts)
        whole = httpx.post(
            f"{base_url}/completion", timeout=60, json={"prompt": prompt, "n_predict": n_predict, "temperature": 0}
        ).json()["content"]
        assert "".join(p["content"] for p in parts) == whole


def test_n_probs_with_a_stop_word_as_the_first_token(base_url: str) -> None:
    """R5: logprobs requested when the stop string is generated first."""
    first = httpx.post(
        f"{base_url}/completion", timeout=60, json={"prompt": "1, 2, 3,", "n_predict": 1, "temperature": 0}
    ).json()["content"]
    r = httpx.post(
        f"{base_url}/completion",
        timeout=60,
        json={"prompt": "1, 2, 3,", "n_predict": 4, "temperature": 0, "n_probs": 5, "stop": [first]},
    )
    assert r.status_code == 200
    assert r.json()["content"] == "" and r.json()["stop_type"] == "word"


@pytest.mark.parametrize("size", [50 * 1024, 1024 * 1024])
def test_enormous_prompts_are_clear_400s(base_url: str, size: int) -> None:
    """R6: big prompts are rejected by context size, quickly, and the server lives on."""
    t0 = time.time()
    r = httpx.post(f"{base_url}/completion", json={"prompt": "word " * (size // 5), "n_predict": 1}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"
    assert time.time() - t0 < 30
    assert httpx.get(f"{base_url}/health").status_code == 200


def test_error_messages_survive_invalid_utf8_and_control_characters(base_url: str) -> None:
    """R25: user strings inside errors never break the error path."""
    r = httpx.post(
        f"{base_url}/completion",
        content=b'{"prompt": "\xff\xfe\x00", "n_predict": 1}',
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400
    r = httpx.post(f"{base_url}/completion", json={"prompt": "x", "samplers": ["\u0000\ud7ff\U0001f600"]})
    assert r.status_code == 400 and "samplers" in r.json()["error"]["message"]


def test_stress_streams_with_random_disconnects_and_health_polling(base_url: str) -> None:
    """R18/R19: 32 concurrent streams, a third dropped early, /health polled throughout."""
    stop = threading.Event()
    health_ok: list[bool] = []
    errors: list[BaseException] = []

    def poll() -> None:
        with httpx.Client(timeout=5) as c:
            while not stop.is_set():
                health_ok.append(c.get(f"{base_url}/health").status_code == 200)
                time.sleep(0.1)

    def worker(i: int) -> None:
        rng = random.Random(i)
        try:
            with httpx.stream(
                "POST",
                f"{base_url}/v1/chat/completions",
                timeout=300,
                json={
                    "messages": [{"role": "user", "content": f"Say something about {i}."}],
                    "max_tokens": 8,
                    "stream": True,
                },
            ) as r:
                for n, _ in enumerate(r.iter_lines()):
                    if i % 3 == 0 and n >= rng.randint(0, 3):
                        return
        except BaseException as exc:  # collected and reported below
            errors.append(exc)

    poller = threading.Thread(target=poll)
    poller.start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    stop.set()
    poller.join()
    assert not errors, errors
    assert health_ok and all(health_ok)
    deadline = time.time() + 10
    while time.time() < deadline:
        if not any(s["is_processing"] for s in httpx.get(f"{base_url}/slots").json()):
            break
        time.sleep(0.1)
    assert not any(s["is_processing"] for s in httpx.get(f"{base_url}/slots").json())


def test_metrics_text_parses_with_prometheus_client(guarded: tuple[RunningServer, Path]) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{guarded[0].url}/metrics", headers={"x-api-key": KEY}).text
    names = {family.name for family in text_string_to_metric_families(text)}
    assert "llamacpp:prompt_tokens" in names or "llamacpp:prompt_tokens_total" in names
    assert "llamaserve:request_duration_seconds" in names


def test_cors_allows_listed_origins_only(model_path: str, tmp_path: Path) -> None:
    srv = start_server(["-m", model_path, "-np", "1", "-c", "512", "--cors-origins", "https://app.example"], tmp_path)
    try:
        preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        ok = httpx.options(f"{srv.url}/v1/chat/completions", headers={"Origin": "https://app.example", **preflight})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example"
        refused = httpx.options(
            f"{srv.url}/v1/chat/completions", headers={"Origin": "https://evil.example", **preflight}
        )
        # llama-server answers every preflight 200; an unlisted origin just gets no allow-origin.
        assert refused.status_code == 200 and "access-control-allow-origin" not in refused.headers
    finally:
        stop_server(srv)


def test_a_40_mib_body_is_413_under_the_default_limit(base_url: str) -> None:
    body = b'{"prompt": "' + b"a" * (40 * 1024 * 1024) + b'"}'
    r = httpx.post(f"{base_url}/completion", content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413
    assert httpx.get(f"{base_url}/health").status_code == 200
