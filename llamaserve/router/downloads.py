"""The router's model downloads (`POST /models`): each in a worker thread through the hub's
resumable fetch (hub/resolve.py), into the download cache, with progress told to `/models/sse`.

As in llama-server: the request is checked against the hub first (a repo or quant it does not
have is a 400 before anything starts); a download takes no model slot; it reports
`download_progress` (`{url: {done, total}}`), then `download_finished` or `download_failed`;
`POST /models/unload` cancels it (the `.part` stays, so asking again resumes). A finished
download is in the model list at once (the catalog is read again before `download_finished`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from llamaserve.errors import APIError
from llamaserve.hub.errors import DownloadError
from llamaserve.hub.hf import hub_endpoint
from llamaserve.hub.remove import check_downloadable
from llamaserve.hub.resolve import TIMEOUT, USER_AGENT, ModelSource, fetch_model

log = logging.getLogger("llamaserve.router")

PROGRESS_EVERY_S = 0.25  # at most this often per download, besides its first and last word


class Cancelled(Exception):
    """Raised in the download's thread when `POST /models/unload` asked it to stop."""


@dataclass
class _Job:
    name: str
    stop: threading.Event = field(default_factory=threading.Event)
    progress: dict[str, dict[str, int]] = field(default_factory=dict)  # url -> {done, total}
    task: asyncio.Task[None] | None = None


class Downloads:
    def __init__(
        self,
        environ: Mapping[str, str],
        token: str | None,
        emit: Callable[[dict[str, Any]], None],
        finished: Callable[[], Awaitable[None]],
    ) -> None:
        self.environ = dict(environ)
        self.token = token
        self.emit = emit  # one /models/sse event
        self.finished = finished  # reads the catalog again
        self.jobs: dict[str, _Job] = {}

    def progress(self, name: str) -> dict[str, dict[str, int]] | None:
        job = self.jobs.get(name)
        return None if job is None else dict(job.progress)

    def _check(self, name: str) -> None:
        with httpx.Client(follow_redirects=True, timeout=TIMEOUT, headers={"User-Agent": USER_AGENT}) as client:
            check_downloadable(client, hub_endpoint(self.environ), name, self.token)

    async def start(self, name: str) -> None:
        """Check `name` against the hub, then download it in the background; APIError (400) when it cannot start."""
        if name in self.jobs:
            raise APIError(f"model '{name}' is already being downloaded")
        try:
            await asyncio.to_thread(self._check, name)
        except DownloadError as exc:
            log.error("model '%s' cannot be downloaded: %s", name, exc)
            raise APIError(f"model validation failed, unable to download: {exc}") from exc
        if name in self.jobs:  # asked twice while the hub was checked
            raise APIError(f"model '{name}' is already being downloaded")
        job = self.jobs[name] = _Job(name)
        job.task = asyncio.create_task(self._run(job))
        log.info("starting download for model '%s'", name)

    async def _run(self, job: _Job) -> None:
        loop = asyncio.get_running_loop()
        last = 0.0

        def hook(url: str, done: int, total: int | None) -> None:  # in the worker thread
            nonlocal last
            if job.stop.is_set():
                raise Cancelled()
            now = time.monotonic()
            if now - last < PROGRESS_EVERY_S and done != total and done != 0:
                return
            last = now
            loop.call_soon_threadsafe(self._progress, job, url, done, total or 0)

        source = ModelSource(hf_repo=job.name, hf_token=self.token)
        error = ""
        try:
            await asyncio.to_thread(fetch_model, source, self.environ, hook)
        except Cancelled:
            error = "cancelled"
        except (DownloadError, OSError) as exc:
            error = str(exc)
        finally:
            del self.jobs[job.name]
        if error:
            log.warning("download of model '%s' failed: %s", job.name, error)
            self.emit({"model": job.name, "event": "download_failed", "data": {"error": error}})
            return
        log.info("download of model '%s' finished", job.name)
        await self.finished()  # listed before the event says so
        self.emit({"model": job.name, "event": "download_finished"})

    def _progress(self, job: _Job, url: str, done: int, total: int) -> None:
        job.progress[url] = {"done": done, "total": total}
        self.emit({"model": job.name, "event": "download_progress", "data": dict(job.progress)})

    async def cancel(self, name: str) -> bool:
        """Stop `name`'s download and wait for its thread to let go; False when none runs."""
        job = self.jobs.get(name)
        if job is None or job.task is None:
            return False
        log.info("cancelling download for model '%s'", name)
        job.stop.set()
        await asyncio.shield(job.task)
        return True

    async def shutdown(self) -> None:
        for name in list(self.jobs):
            await self.cancel(name)
