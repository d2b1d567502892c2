"""`-dr` Docker models against a stand-in OCI registry on loopback serving the real SmolLM2 file.

The stand-in answers what llama.cpp asks Docker Hub: `GET /token` (auth),
`GET /v2/<repo>/manifests/<tag>` (bearer token required; 401 for an unknown
repo and 404 for an unknown tag, as Docker Hub does) and
`GET /v2/<repo>/blobs/<digest>`, which redirects to a CDN on another origin
(a `StandInHub` here), as Docker Hub does.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from llamaserve.cli import config_from_args
from llamaserve.hub.cache import cache_dir
from llamaserve.hub.cache_list import format_cache_list, list_cached_models
from llamaserve.hub.docker import AUTH_ENV, GGUF_MEDIA_TYPE, MANIFEST_ACCEPT, REGISTRY_ENV, resolve_docker
from llamaserve.hub.errors import DownloadError, HubUnreachable
from tests.server.conftest import free_port, start_server, stop_server
from tests.server.standin_hub import Seen, StandInHub
from tests.server.test_downloads import REPO_ID, make_hub, sha256

TAG = "135M-Q4_K_M"
CACHED = f"ai_smollm2_{TAG}.gguf"  # llama.cpp's name for ai/smollm2:<TAG>
LICENSE = b"Apache-2.0"
TINY = b"GGUF tiny"
_V2 = re.compile(r"^/v2/(?P<repo>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def manifest(*layers: tuple[str, str]) -> dict[str, object]:
    return {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.docker.ai.model.config.v0.1+json", "digest": digest_of(b"{}")},
        "layers": [{"mediaType": media, "digest": digest} for media, digest in layers],
    }


@dataclass
class StandInRegistry:
    """`manifests` maps (repo, tag) to a manifest; blob digests redirect to `cdn`'s `/files/<hex>`."""

    manifests: dict[tuple[str, str], dict[str, object]]
    cdn: StandInHub
    seen: list[Seen] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def do_GET(self) -> None:
                registry._handle(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="standin-registry", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        split = urllib.parse.urlsplit(h.path)
        self.seen.append(Seen("GET", h.path, {k.lower(): v for k, v in h.headers.items()}))
        if split.path == "/token":
            query = urllib.parse.parse_qs(split.query)
            scope = query.get("scope", [""])[0]
            if query.get("service") != ["registry.docker.io"] or not scope.endswith(":pull"):
                self._json(h, 400, {"details": "bad token request"})
                return
            # Docker Hub grants an anonymous token for any name; the manifest request is what fails.
            self._json(h, 200, {"token": f"tok:{scope}", "expires_in": 300})
            return
        m = _V2.match(split.path)
        if m is None:
            self._json(h, 404, {"errors": [{"code": "NAME_UNKNOWN"}]})
            return
        repo, kind, ref = m.group("repo"), m.group("kind"), m.group("ref")
        if h.headers.get("Authorization") != f"Bearer tok:repository:{repo}:pull":
            self._json(h, 401, {"errors": [{"code": "UNAUTHORIZED"}]})
        elif kind == "manifests" and not any(r == repo for r, _ in self.manifests):
            self._json(h, 401, {"errors": [{"code": "UNAUTHORIZED"}]})  # Docker Hub's answer for no such repo
        elif kind == "manifests" and (repo, ref) not in self.manifests:
            self._json(h, 404, {"errors": [{"code": "MANIFEST_UNKNOWN"}]})
        elif kind == "manifests":
            self._json(h, 200, self.manifests[(repo, ref)], "application/vnd.oci.image.manifest.v1+json")
        else:
            h.send_response(307)
            h.send_header("Location", f"{self.cdn.url}/files/{ref.removeprefix('sha256:')}")
            h.send_header("Content-Length", "0")
            h.end_headers()

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, status: int, body: object, media: str = "application/json") -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", media)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)


@pytest.fixture(scope="module")
def model_digest(model_path: str) -> str:
    return "sha256:" + sha256(Path(model_path))


@pytest.fixture()
def registry(model_path: str, model_digest: str) -> Iterator[StandInRegistry]:
    cdn = StandInHub(
        {},
        files={
            model_digest[7:]: Path(model_path),
            digest_of(LICENSE)[7:]: LICENSE,
            digest_of(b"GGUF other")[7:]: TINY,  # a blob whose bytes do not match its digest
        },
    )
    cdn.start()
    reg = StandInRegistry(
        {
            # The license layer comes first: the GGUF layer is picked by media type, not position.
            ("ai/smollm2", TAG): manifest(
                ("application/vnd.docker.ai.license", digest_of(LICENSE)), (GGUF_MEDIA_TYPE, model_digest)
            ),
            ("ai/smollm2", "license-only"): manifest(("application/vnd.docker.ai.license", digest_of(LICENSE))),
            ("ai/smollm2", "corrupt"): manifest((GGUF_MEDIA_TYPE, digest_of(b"GGUF other"))),
            # Another namespace, and a media type that only mentions gguf (llama.cpp accepts both).
            ("me/tiny", "latest"): manifest(("application/x-gguf", "sha256:" + model_digest[7:].upper())),
        },
        cdn,
    )
    reg.start()
    yield reg
    reg.stop()
    cdn.stop()


def env_for(registry_url: str) -> dict[str, str]:
    # The auth service and the registry are one stand-in here; on Docker Hub they are two hosts.
    return {REGISTRY_ENV: registry_url, AUTH_ENV: registry_url}


def test_download_then_cache_with_the_registry_down(
    registry: StandInRegistry, model_digest: str, tmp_path: Path
) -> None:
    env = env_for(registry.url)
    path = resolve_docker(f"smollm2:{TAG}", cache=tmp_path, offline=False, environ=env)
    assert path == str(tmp_path / CACHED) and "sha256:" + sha256(Path(path)) == model_digest
    assert not list(tmp_path.glob("*.part*")) and not list(tmp_path.glob("*.lock"))

    token_req, manifest_req, blob_req = registry.seen
    assert token_req.path == "/token?service=registry.docker.io&scope=repository:ai/smollm2:pull"
    assert manifest_req.path == f"/v2/ai/smollm2/manifests/{TAG}"
    assert manifest_req.headers["accept"] == MANIFEST_ACCEPT
    assert blob_req.path == f"/v2/ai/smollm2/blobs/{model_digest}"
    assert blob_req.headers["authorization"] == "Bearer tok:repository:ai/smollm2:pull"
    # Only the GGUF blob was fetched, and the token stayed off the CDN's origin.
    (cdn_req,) = registry.cdn.seen
    assert cdn_req.path == f"/files/{model_digest[7:]}" and "authorization" not in cdn_req.headers

    registry.stop()
    registry.cdn.stop()
    for offline in (False, True):
        assert resolve_docker(f"ai/smollm2:{TAG}", cache=tmp_path, offline=offline, environ=env) == path


def test_other_namespace_and_default_tag(registry: StandInRegistry, model_digest: str, tmp_path: Path) -> None:
    path = resolve_docker("me/tiny", cache=tmp_path, offline=False, environ=env_for(registry.url))
    assert path == str(tmp_path / "me_tiny_latest.gguf")
    # The digest is lower-cased before use, as llama.cpp normalises it.
    assert registry.seen[-1].path == f"/v2/me/tiny/blobs/{model_digest}"


def test_errors_are_clear(registry: StandInRegistry, tmp_path: Path) -> None:
    env = env_for(registry.url)
    cases = [
        ("smollm2", "--offline: Docker model ai/smollm2:latest is not in the cache", True),
        ("ai/nothing:latest", "Docker model ai/nothing:latest not found on .* or access denied \\(HTTP 401\\)", False),
        ("smollm2:Q9_9", "Docker model ai/smollm2:Q9_9 not found on .* \\(HTTP 404\\)", False),
        ("smollm2:license-only", "no GGUF layer in the Docker manifest of ai/smollm2:license-only", False),
        ("smollm2:corrupt", "does not match its digest", False),
        ("Upper/Case", "--docker-repo must look like", False),
        ("smollm2:", "--docker-repo must look like", False),
    ]
    for spec, message, offline in cases:
        with pytest.raises(DownloadError, match=message):
            resolve_docker(spec, cache=tmp_path, offline=offline, environ=env)
    assert not list(tmp_path.iterdir())
    down = env_for(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(HubUnreachable, match="cannot reach the Docker registry"):
        resolve_docker("smollm2", cache=tmp_path, offline=False, environ=down)


def test_cache_list_after_hf_and_docker_downloads(registry: StandInRegistry, model_path: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    hub = make_hub(model_path)
    try:
        env = {"LLAMA_CACHE": str(cache), "HF_ENDPOINT": hub.url, **env_for(registry.url)}
        config_from_args(["-hf", REPO_ID], environ=env)
        config_from_args(["-hf", "fake/split-GGUF:Q2_K"], environ=env)
    finally:
        hub.stop()
    resolve_docker(f"smollm2:{TAG}", cache=cache_dir(env), offline=False, environ=env)
    # The docker model is cached but, as in llama.cpp, not listed.
    assert (cache / CACHED).is_file()
    models = list_cached_models(cache)
    assert models == ["fake/SmolLM2-135M-Instruct-GGUF:Q4_K_M", "fake/split-GGUF:Q2_K"]
    assert format_cache_list(models) == (
        "number of models in cache: 2\n   1. fake/SmolLM2-135M-Instruct-GGUF:Q4_K_M\n   2. fake/split-GGUF:Q2_K\n"
    )


def test_docker_repo_flag_serves_the_downloaded_model(registry: StandInRegistry, tmp_path: Path) -> None:
    env = {**env_for(registry.url), "LLAMA_CACHE": str(tmp_path)}
    server = start_server(["-dr", f"smollm2:{TAG}", "-c", "512"], tmp_path, env=env)
    try:
        props = httpx.get(f"{server.url}/props", timeout=30).json()
        assert props["model_path"] == str(tmp_path / CACHED)
        r = httpx.post(f"{server.url}/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=60)
        assert r.status_code == 200
    finally:
        stop_server(server)
