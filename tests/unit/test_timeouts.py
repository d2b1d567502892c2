"""--timeout's ASGI half: stalled body reads answer 408, stalled writes end the exchange, streams flow."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from llamaserve.api.timeouts import TimeoutMiddleware

Message = dict[str, Any]


async def _echo_app(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body, then answers it back."""
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def _scope(path: str = "/completion") -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": path, "client": ("127.0.0.1", 1), "headers": []}


def _run(app: Any, receive: Any, path: str = "/completion", send_delay: float = 0.0) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        if send_delay:
            await asyncio.sleep(send_delay)
        sent.append(message)

    asyncio.run(TimeoutMiddleware(app, 0.2)(_scope(path), receive, send))
    return sent


def _stalling_after(first: bytes) -> Any:
    """A client that sends ``first`` of a longer body, then nothing."""

    async def receive() -> Message:
        if not hasattr(receive, "sent"):
            receive.sent = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": first, "more_body": True}
        await asyncio.sleep(10)
        raise AssertionError("unreachable")

    return receive


def test_a_stalled_body_gets_408_in_the_openai_envelope() -> None:
    start = time.monotonic()
    sent = _run(_echo_app, _stalling_after(b"0123456789"))
    assert time.monotonic() - start < 2
    assert sent[0]["status"] == 408 and (b"connection", b"close") in sent[0]["headers"]
    body = json.loads(sent[1]["body"])
    assert body["error"]["code"] == 408 and "--timeout" in body["error"]["message"]


def test_anthropic_routes_get_their_envelope() -> None:
    async def receive() -> Message:
        await asyncio.sleep(10)
        raise AssertionError("unreachable")

    sent = _run(_echo_app, receive, path="/v1/messages")
    assert sent[0]["status"] == 408 and json.loads(sent[1]["body"])["type"] == "error"


def test_waiting_for_a_disconnect_after_the_body_is_not_bounded() -> None:
    # A long answer watches for the client's disconnect with receive(): that wait must outlive the timeout.
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()  # the whole body

        async def watch() -> None:
            await receive()

        watcher = asyncio.ensure_future(watch())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(6):  # 0.6 s of streaming, three timeouts long
            await asyncio.sleep(0.1)
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        watcher.cancel()

    async def receive() -> Message:
        if not hasattr(receive, "sent"):
            receive.sent = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    sent = _run(app, receive)
    assert sent[0]["status"] == 200 and len(sent) == 8


def test_a_stalled_write_ends_the_exchange_quietly() -> None:
    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    start = time.monotonic()
    sent = _run(_echo_app, receive, send_delay=5.0)  # every send blocks as if the client stopped reading
    assert sent == [] and time.monotonic() - start < 2


def test_a_write_that_stalls_mid_stream_is_cut_one_timeout_after_it_began() -> None:
    # Quick writes for three timeouts' worth, then one the client never takes: the
    # watch's timer has come and gone while no write was in flight, and must re-arm.
    stalled_at: list[float] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(6):
            await asyncio.sleep(0.1)
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
        stalled_at.append(time.monotonic())
        await send({"type": "http.response.body", "body": b"never taken", "more_body": True})
        raise AssertionError("the stalled write returned")

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        if message.get("body") == b"never taken":
            await asyncio.sleep(10)
        sent.append(message)

    asyncio.run(TimeoutMiddleware(app, 0.2)(_scope(), receive, send))
    waited = time.monotonic() - stalled_at[0]
    assert len(sent) == 7 and 0.19 <= waited < 0.6, waited


def test_other_errors_pass_through() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("boom")

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    try:
        _run(app, receive)
    except ValueError as exc:
        assert str(exc) == "boom"
    else:
        raise AssertionError("the app's error was swallowed")


def test_the_access_log_records_a_stalled_body_as_408(caplog: Any) -> None:
    from llamaserve.api.middleware import AccessLogMiddleware

    with caplog.at_level("INFO"):
        sent = _run(AccessLogMiddleware(_echo_app), _stalling_after(b"0123"))
    assert sent[0]["status"] == 408
    lines = [r.getMessage() for r in caplog.records if r.name == "llamaserve.access"]
    assert len(lines) == 1 and "POST /completion 408 " in lines[0], lines


def test_the_private_uvicorn_protocol_we_subclass_is_the_pinned_one() -> None:
    """api/timeouts.py overrides hooks of uvicorn's private HttpToolsProtocol.

    uvicorn is pinned in pyproject.toml for that reason; if the pin moves or the
    class changes shape, this fails loudly instead of the header timeout silently
    stopping to work.
    """
    import importlib.metadata
    import inspect
    import re
    from pathlib import Path

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    pinned = re.search(r'"uvicorn\[standard\]==([^"]+)"', pyproject)
    assert pinned, "uvicorn must be pinned exactly in pyproject.toml"
    assert importlib.metadata.version("uvicorn") == pinned.group(1)
    for hook in ("connection_made", "on_message_begin", "on_headers_complete", "connection_lost"):
        assert callable(getattr(HttpToolsProtocol, hook, None)), hook
    source = inspect.getsource(HttpToolsProtocol)
    # The timer uses these instance attributes.
    assert "self.loop" in source and "self.transport" in source
