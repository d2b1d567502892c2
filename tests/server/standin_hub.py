"""A stand-in for the Hugging Face Hub on loopback, for the download tests.

It answers the endpoints llamaserve's downloader uses, in the hub's shapes:
- `GET /api/models/{user}/{model}` → `{"id", "sha", "siblings": [{"rfilename"}]}`,
  401 for an unknown repo (as the hub does for missing and private repos alike);
- `GET|HEAD /{user}/{model}/resolve/main/{file}` → 302 to `/cdn/...`, as the hub
  redirects LFS files to its CDN;
- `GET|HEAD /cdn/{user}/{model}/{file}` and `/files/{name}` → the bytes, with
  `ETag`, `Accept-Ranges`, `Content-Length`, `X-Repo-Commit`, and `Range` /
  `If-Range` support (206 with `Content-Range`).
Every request is recorded so tests can assert what the client asked for.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]


def _etag(source: bytes | Path) -> str:
    # The hub's ETag of an LFS file is the quoted sha256; any strong tag does here.
    digest = hashlib.sha256()
    if isinstance(source, Path):
        with open(source, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    else:
        digest.update(source)
    return f'"{digest.hexdigest()}"'


@dataclass
class StandInHub:
    """`repos` maps "user/model" to {file name: bytes or a path to serve}; `files` backs `/files/{name}`."""

    repos: dict[str, dict[str, bytes | Path]]
    files: dict[str, bytes | Path] = field(default_factory=dict)
    token: str | None = None  # when set, every request must carry `Authorization: Bearer <token>`
    cut_first_transfer_at: int | None = None  # drop the first body transfer after this many bytes
    slow: frozenset[str] = frozenset()  # "user/model/file" sent 64 KiB every 50 ms (a download to cancel)
    seen: list[Seen] = field(default_factory=list)
    _etags: dict[int, str] = field(default_factory=dict)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:  # keep test output clean
                pass

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

            def do_GET(self) -> None:
                hub._handle(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="standin-hub", daemon=True).start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def requests_for(self, fragment: str) -> list[Seen]:
        return [s for s in self.seen if fragment in s.path]

    # ------------------------------------------------------------ handling
    def _etag_of(self, source: bytes | Path) -> str:
        key = id(source)
        if key not in self._etags:
            self._etags[key] = _etag(source)
        return self._etags[key]

    def _handle(self, h: BaseHTTPRequestHandler, *, head: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(h.path).path)
        self.seen.append(Seen(h.command, path, {k.lower(): v for k, v in h.headers.items()}))
        if self.token and h.headers.get("Authorization") != f"Bearer {self.token}":
            self._json(h, 401, {"error": "Invalid credentials in Authorization header"}, head)
            return
        parts = path.strip("/").split("/")
        if path.startswith("/api/models/") and len(parts) >= 4:
            repo = "/".join(parts[2:4])
            if repo not in self.repos:
                self._json(h, 401, {"error": "Repository not found"}, head)
                return
            self._json(
                h, 200, {"id": repo, "sha": COMMIT, "siblings": [{"rfilename": f} for f in self.repos[repo]]}, head
            )
        elif len(parts) >= 5 and parts[2] == "resolve":
            repo, name = "/".join(parts[:2]), "/".join(parts[4:])
            if name not in self.repos.get(repo, {}):
                self._json(h, 404, {"error": "Entry not found"}, head)
                return
            h.send_response(302)
            h.send_header("Location", "/cdn/" + urllib.parse.quote(f"{repo}/{name}"))
            h.send_header("X-Repo-Commit", COMMIT)
            h.send_header("Content-Length", "0")
            h.end_headers()
        elif parts[0] == "cdn" and len(parts) >= 4:
            repo, name = "/".join(parts[1:3]), "/".join(parts[3:])
            source = self.repos.get(repo, {}).get(name)
            self._serve(h, source, head, slow=f"{repo}/{name}" in self.slow)
        elif parts[0] == "files" and len(parts) == 2:
            self._serve(h, self.files.get(parts[1]), head)
        else:
            self._json(h, 404, {"error": "not found"}, head)

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, status: int, body: object, head: bool) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if not head:
            h.wfile.write(data)

    def _serve(self, h: BaseHTTPRequestHandler, source: bytes | Path | None, head: bool, slow: bool = False) -> None:
        if source is None:
            self._json(h, 404, {"error": "Entry not found"}, head)
            return
        size = source.stat().st_size if isinstance(source, Path) else len(source)
        etag = self._etag_of(source)
        start, end = 0, size - 1
        status = 200
        m = _RANGE.match(h.headers.get("Range", ""))
        if_range = h.headers.get("If-Range")
        if m and (if_range is None or if_range == etag):
            start = int(m.group(1))
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if start >= size:
                h.send_response(416)
                h.send_header("Content-Range", f"bytes */{size}")
                h.send_header("Content-Length", "0")
                h.end_headers()
                return
            status = 206
        h.send_response(status)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("ETag", etag)
        h.send_header("X-Repo-Commit", COMMIT)
        h.send_header("Content-Length", str(end - start + 1))
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        h.end_headers()
        if head:
            return
        limit = end - start + 1
        if self.cut_first_transfer_at is not None:
            limit = min(limit, self.cut_first_transfer_at)
            self.cut_first_transfer_at = None
        try:
            if isinstance(source, Path):
                with open(source, "rb") as fh:
                    fh.seek(start)
                    left = limit
                    while left > 0:
                        block = fh.read(min(1 << 16 if slow else 1 << 20, left))
                        if not block:
                            break
                        h.wfile.write(block)
                        left -= len(block)
                        if slow:
                            time.sleep(0.05)
            else:
                h.wfile.write(source[start : start + limit])
        except (BrokenPipeError, ConnectionResetError):
            pass
        h.close_connection = True
