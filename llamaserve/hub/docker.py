"""`-dr/--docker-repo [<repo>/]<model>[:tag]` → a local GGUF from Docker Hub's OCI registry.

The steps are llama.cpp's (`common_docker_resolve_model`): an anonymous pull
token from auth.docker.io, the tag's manifest from registry-1.docker.io, the
first layer whose media type names GGUF, and that blob saved in the cache as
`<repo with _ for />_<tag>.gguf`, the file name llama.cpp uses, so either
program finds what the other fetched.

Three things differ on purpose, to match how `-hf` behaves here: a model
already in the cache is used without asking the registry (so a start works
with the registry down; a tag moved upstream is not noticed until the file
is deleted), `offline` never touches the network, and a fresh blob is checked
against its manifest digest (the name is per tag, not per digest, so a `.part`
left by an older tag could otherwise be resumed into a wrong file).

`LLAMASERVE_DOCKER_REGISTRY` and `LLAMASERVE_DOCKER_AUTH` replace the two base
URLs, for a mirror or a stand-in registry in tests.
"""

from __future__ import annotations

import hashlib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from llamaserve.hub.cache import docker_cache_path
from llamaserve.hub.errors import DownloadError, HubUnreachable
from llamaserve.hub.fetch import download
from llamaserve.hub.resolve import TIMEOUT, USER_AGENT

REGISTRY_ENV = "LLAMASERVE_DOCKER_REGISTRY"
AUTH_ENV = "LLAMASERVE_DOCKER_AUTH"
DEFAULT_REGISTRY = "https://registry-1.docker.io"
DEFAULT_AUTH = "https://auth.docker.io"
DEFAULT_NAMESPACE = "ai"  # Docker's model catalogue; llama.cpp adds it when the spec has no '/'
DEFAULT_TAG = "latest"
# The two manifest types llama.cpp accepts; an index (multi-platform list) is never asked for.
MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json,application/vnd.oci.image.manifest.v1+json"
GGUF_MEDIA_TYPE = "application/vnd.docker.ai.gguf.v3"

# OCI distribution-spec grammar: lowercase path components, and the tag rule.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-fA-F]{64}$")


@dataclass(frozen=True)
class DockerRef:
    repo: str  # e.g. ai/smollm2, the default namespace filled in
    tag: str  # e.g. 135M-Q4_0, or latest

    def __str__(self) -> str:
        return f"{self.repo}:{self.tag}"


def parse_docker_ref(spec: str) -> DockerRef:
    """`smollm2` → ai/smollm2:latest; `me/model:Q8_0` stays as written (first ':' splits, as in llama.cpp)."""
    repo, sep, tag = spec.strip().partition(":")
    if not sep:
        tag = DEFAULT_TAG
    if "/" not in repo:
        repo = f"{DEFAULT_NAMESPACE}/{repo}"
    if not _NAME.match(repo) or not _TAG.match(tag):
        raise DownloadError(
            "--docker-repo must look like [<repo>/]<model>[:quant] with a lowercase name "
            f"(e.g. ai/smollm2:135M-Q4_0), got '{spec}'"
        )
    return DockerRef(repo, tag)


def registry_url(environ: Mapping[str, str]) -> str:
    return (environ.get(REGISTRY_ENV) or DEFAULT_REGISTRY).rstrip("/")


def auth_url(environ: Mapping[str, str]) -> str:
    return (environ.get(AUTH_ENV) or DEFAULT_AUTH).rstrip("/")


def _say(text: str) -> None:
    # Runs before logging is set up, like the -hf download; llama-server reports on stderr too.
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


def _get(client: httpx.Client, url: str, headers: dict[str, str], what: str) -> httpx.Response:
    try:
        return client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise HubUnreachable(f"cannot reach the Docker registry for {what} at {url}: {exc}") from None


def _json_object(resp: httpx.Response, what: str) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise DownloadError(f"the Docker registry sent an unreadable {what} ({resp.url})")
    return data


def fetch_token(client: httpx.Client, auth: str, repo: str) -> str:
    """An anonymous bearer token allowed to pull `repo` (Docker Hub gives one even for public repos only)."""
    url = f"{auth}/token?service=registry.docker.io&scope=repository:{repo}:pull"
    resp = _get(client, url, {}, f"a token for {repo}")
    if resp.status_code != 200:
        raise DownloadError(f"failed to get a Docker registry token for {repo}: HTTP {resp.status_code} from {url}")
    data = _json_object(resp, "token response")
    # `token` is what llama.cpp reads; `access_token` is the OAuth2 name some registries send instead.
    token = data.get("token") or data.get("access_token")
    if not isinstance(token, str) or not token:
        raise DownloadError(f"the Docker registry token response for {repo} has no 'token' field ({url})")
    return token


def fetch_manifest(client: httpx.Client, registry: str, ref: DockerRef, token: str) -> dict[str, Any]:
    url = f"{registry}/v2/{ref.repo}/manifests/{ref.tag}"
    headers = {"Authorization": f"Bearer {token}", "Accept": MANIFEST_ACCEPT}
    resp = _get(client, url, headers, f"the manifest of {ref}")
    if resp.status_code in (401, 403, 404):
        # Docker Hub answers 401 for a repository that does not exist, 404 for a missing tag.
        raise DownloadError(
            f"Docker model {ref} not found on {registry} or access denied (HTTP {resp.status_code}); "
            "check the name and tag (the repo defaults to ai/, the tag to latest)"
        )
    if resp.status_code != 200:
        raise DownloadError(f"failed to get the Docker manifest of {ref}: HTTP {resp.status_code} from {url}")
    return _json_object(resp, f"manifest for {ref}")


def gguf_layer_digest(manifest: Mapping[str, Any], ref: DockerRef) -> str:
    """The digest (lowercase hex) of the first layer whose media type is GGUF's, as llama.cpp picks it."""
    layers = manifest.get("layers")
    types: list[str] = []
    for layer in layers if isinstance(layers, list) else []:
        media_type = layer.get("mediaType") if isinstance(layer, dict) else None
        if not isinstance(media_type, str):
            continue
        types.append(media_type)
        if media_type == GGUF_MEDIA_TYPE or "gguf" in media_type:
            digest = layer.get("digest")
            if not isinstance(digest, str) or not _DIGEST.match(digest):
                raise DownloadError(f"the Docker manifest of {ref} has an invalid GGUF layer digest: {digest!r}")
            return "sha256:" + digest[7:].lower()
    listed = ", ".join(types) if types else "no layers"
    raise DownloadError(f"no GGUF layer in the Docker manifest of {ref} ({listed})")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def resolve_docker(spec: str, *, cache: Path, offline: bool, environ: Mapping[str, str]) -> str:
    """The local path of Docker model `spec`, downloaded into `cache` unless already there.

    Raises `DownloadError` (a bad spec, a missing repo or tag, no GGUF layer,
    a failed download, a digest mismatch, or an `offline` cache miss).
    """
    ref = parse_docker_ref(spec)
    dest = docker_cache_path(cache, ref.repo, ref.tag)
    if dest.is_file():
        _say(f"model: using cached {dest}")
        return str(dest)
    if offline:
        raise DownloadError(
            f"--offline: Docker model {ref} is not in the cache (looked for {dest}); "
            "run once without --offline to download it"
        )
    registry = registry_url(environ)
    with httpx.Client(follow_redirects=True, timeout=TIMEOUT, headers={"User-Agent": USER_AGENT}) as client:
        token = fetch_token(client, auth_url(environ), ref.repo)
        digest = gguf_layer_digest(fetch_manifest(client, registry, ref, token), ref)
        url = f"{registry}/v2/{ref.repo}/blobs/{digest}"
        _say(f"model: downloading Docker model {ref} ({digest}) -> {dest}")
        # Docker Hub redirects blobs to a CDN; httpx drops the Authorization header on that cross-origin hop.
        download(client, url, dest, token=token, label=str(ref))
    actual = _sha256(dest)
    if actual != digest:
        dest.unlink(missing_ok=True)
        raise DownloadError(f"the download of Docker model {ref} does not match its digest ({actual} != {digest})")
    return str(dest)
