"""The HTTP side runs on uvloop where installed, and on asyncio's own loop when asked."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from llamaserve.api.event_loop import fast_loop_factory, run_on_fast_loop


def _running_loop() -> asyncio.AbstractEventLoop:
    seen: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        seen.append(asyncio.get_running_loop())

    run_on_fast_loop(main())
    return seen[0]


def test_uvloop_serves_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLAMASERVE_LOOP", raising=False)
    assert fast_loop_factory() is uvloop.new_event_loop
    assert isinstance(_running_loop(), uvloop.Loop)


def test_llamaserve_loop_asyncio_keeps_the_standard_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMASERVE_LOOP", "asyncio")
    assert fast_loop_factory() is None
    assert not isinstance(_running_loop(), uvloop.Loop)
