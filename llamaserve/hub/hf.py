"""The two Hugging Face Hub endpoints a download needs: a repo's file list and a file's URL.

The endpoint is `MODEL_ENDPOINT` or `HF_ENDPOINT` (llama.cpp reads both, in that
order), else https://huggingface.co, so a mirror or a local stand-in works.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

import httpx

from llamaserve.hub.errors import DownloadError, HubUnreachable

DEFAULT_ENDPOINT = "https://huggingface.co"


def hub_endpoint(environ: Mapping[str, str]) -> str:
    for name in ("MODEL_ENDPOINT", "HF_ENDPOINT"):
        if environ.get(name):
            return environ[name].rstrip("/")
    return DEFAULT_ENDPOINT


def file_url(endpoint: str, repo: str, rfilename: str, revision: str = "main") -> str:
    return f"{endpoint}/{repo}/resolve/{revision}/{urllib.parse.quote(rfilename)}"


def list_repo_files(client: httpx.Client, endpoint: str, repo: str, token: str | None) -> list[str]:
    """The repo's file names (`siblings[].rfilename` of `GET /api/models/{repo}`), in the hub's order."""
    url = f"{endpoint}/api/models/{repo}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        raise HubUnreachable(f"cannot reach the model hub at {endpoint} to list {repo}: {exc}") from None
    if resp.status_code in (401, 403, 404):
        # The hub answers 401 for a repo that does not exist as well as for a private one.
        hint = "" if token else " (if it is private or gated, pass --hf-token or set HF_TOKEN)"
        raise DownloadError(f"repo {repo} not found on {endpoint} or access denied (HTTP {resp.status_code}){hint}")
    if resp.status_code >= 400:
        raise DownloadError(f"listing repo {repo} on {endpoint} failed: HTTP {resp.status_code}")
    try:
        siblings = resp.json().get("siblings") or []
        return [s["rfilename"] for s in siblings if isinstance(s, dict) and isinstance(s.get("rfilename"), str)]
    except (ValueError, AttributeError):
        raise DownloadError(f"the hub at {endpoint} sent an unreadable file list for {repo}") from None
