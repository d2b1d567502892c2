"""One resumable HTTP(S) download into the cache.

Bytes go to `<dest>.part` and the file is renamed to `dest` only once complete,
so a file without the suffix is always whole. A later run resumes a `.part`
with a `Range` request (guarded by `If-Range` with the first answer's ETag, so
a file that changed upstream restarts instead of being spliced). A lock file
keeps two processes from writing the same part.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from llamaserve.hub.cache import PART_SUFFIX
from llamaserve.hub.errors import DownloadError
from llamaserve.hub.progress import ProgressBar

CHUNK = 1024 * 1024
RETRIES = 3  # further attempts, each only after the previous one made progress
GGUF_MAGIC = b"GGUF"
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


# Told (url, bytes on disk, total or None) as a transfer starts and after each chunk; it may
# raise to stop the download (the `.part` stays, so a later download resumes it).
ProgressHook = Callable[[str, int, "int | None"], None]


class _Restart(Exception):
    """The part cannot be resumed (range refused or misplaced): start it over."""


def _paths(dest: Path) -> tuple[Path, Path, Path]:
    return (
        dest.with_name(dest.name + PART_SUFFIX),
        dest.with_name(dest.name + PART_SUFFIX + ".etag"),
        dest.with_name(dest.name + ".lock"),
    )


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+b") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write(f"waiting for another process downloading {lock_path.name[:-5]} ...\n")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def http_error_message(status: int, url: str) -> str:
    if status in (401, 403):
        return (
            f"access denied (HTTP {status}) for {url}: the repo may be private or gated; "
            "pass --hf-token or set HF_TOKEN"
        )
    if status == 404:
        return f"not found (HTTP 404): {url}"
    return f"HTTP {status} from {url}"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _discard(*paths: Path) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def _fetch_once(
    client: httpx.Client, url: str, dest: Path, headers: dict[str, str], label: str, hook: ProgressHook | None
) -> None:
    part, etag_path, _ = _paths(dest)
    offset = _size(part)
    req_headers = dict(headers)
    if offset:
        req_headers["Range"] = f"bytes={offset}-"
        etag = etag_path.read_text().strip() if etag_path.is_file() else ""
        if etag and not etag.startswith("W/"):  # If-Range takes strong validators only
            req_headers["If-Range"] = etag
    with client.stream("GET", url, headers=req_headers) as resp:
        if resp.status_code == 416 and offset:
            raise _Restart()
        if resp.status_code >= 400:
            raise DownloadError(http_error_message(resp.status_code, url))
        total: int | None
        if resp.status_code == 206:
            m = _CONTENT_RANGE.match(resp.headers.get("content-range", ""))
            if not m or int(m.group(1)) != offset:
                raise _Restart()
            total = int(m.group(3)) if m.group(3) != "*" else None
            mode = "ab"
        else:
            # A 200 is the whole file: the server ignored the range or the file changed.
            offset = 0
            length = resp.headers.get("content-length")
            total = int(length) if length and length.isdigit() else None
            mode = "wb"
            etag = resp.headers.get("etag", "")
            if etag:
                etag_path.write_text(etag)
            else:
                _discard(etag_path)
        bar = ProgressBar(label, total, start=offset)
        done = offset
        try:
            if hook is not None:
                hook(url, done, total)
            with open(part, mode) as fh:
                for chunk in resp.iter_raw(CHUNK):
                    fh.write(chunk)
                    done += len(chunk)
                    bar.update(done)
                    if hook is not None:
                        hook(url, done, total)
        except BaseException:
            bar.abandon()
            raise
        if total is not None and done != total:
            bar.abandon()
            raise httpx.ReadError(f"connection closed after {done} of {total} bytes")
        bar.finish()


def download(
    client: httpx.Client,
    url: str,
    dest: Path,
    *,
    token: str | None = None,
    label: str | None = None,
    hook: ProgressHook | None = None,
) -> None:
    """Make `dest` a complete copy of `url`, resuming a `.part` an earlier run left; `hook` hears
    the progress (and may stop it by raising)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part, etag_path, lock_path = _paths(dest)
    # identity: lengths and ranges must count the bytes on disk, not a compressed stream.
    headers = {"Accept-Encoding": "identity"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    label = label or dest.name
    with _locked(lock_path):
        if dest.is_file():
            return  # another process finished it while we waited
        retries = RETRIES
        restarted = False
        while True:
            before = _size(part)
            try:
                _fetch_once(client, url, dest, headers, label, hook)
                break
            except _Restart:
                if restarted:
                    raise DownloadError(f"the server for {url} does not resume downloads sensibly") from None
                restarted = True
                _discard(part, etag_path)
            except httpx.HTTPError as exc:
                # Retry only a transfer that was moving: a refused connection fails at once.
                if retries > 0 and _size(part) > before:
                    retries -= 1
                    time.sleep(1.0)
                    continue
                raise DownloadError(
                    f"download of {url} failed: {exc or type(exc).__name__} (partial file kept; run again to resume)"
                ) from None
        with open(part, "rb") as fh:
            if fh.read(4) != GGUF_MAGIC:
                _discard(part, etag_path)
                raise DownloadError(f"{url} is not a GGUF file (is the URL right?)")
        os.replace(part, dest)
        # Safe to drop while held: whoever takes the lock next sees `dest` and stops.
        _discard(etag_path, lock_path)
