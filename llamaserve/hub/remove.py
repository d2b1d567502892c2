"""A downloaded model taken out of the cache (the router's `DELETE /models`), and the check a
download request passes before it starts (the router's `POST /models`).

A model of the flat cache (`-hf` downloads) is its manifest's files, whatever a download left
beside them (`.part`, ETag, lock) and the manifest itself; one of the hub's layout is its
snapshot entry and the blob that entry points at.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx

from llamaserve.hub.cache import PART_SUFFIX, hf_cache_path, manifest_path, read_manifest, repo_prefix
from llamaserve.hub.cache_list import gguf_tag
from llamaserve.hub.hf import list_repo_files
from llamaserve.hub.hub_layout import find_hub_model
from llamaserve.hub.select import parse_repo, pick_files

_LEFTOVERS = ("", PART_SUFFIX, PART_SUFFIX + ".etag", ".lock")


def _unlink(path: Path) -> bool:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        return True
    return False


def _flat_files(cache: Path, repo: str, tag: str | None) -> list[Path]:
    """The cached files of `repo:tag`: those its manifest names, else those whose name carries the tag."""
    named = read_manifest(cache, repo, tag)
    if named:
        return [hf_cache_path(cache, repo, name) for name in named]
    prefix = repo_prefix(repo)
    try:
        names = sorted(p.name for p in cache.iterdir() if p.name.startswith(prefix))
    except OSError:
        return []
    wanted = (tag or "").upper()
    out: list[Path] = []
    for name in names:
        base = name[: -len(PART_SUFFIX)] if name.endswith(PART_SUFFIX) else name
        if gguf_tag(base[len(prefix) :]) == wanted:
            out.append(cache / base)
    return out


def remove_cached_model(cache: Path, model_id: str) -> bool:
    """Delete `ORG/NAME[:TAG]`'s files from the cache; False when there were none."""
    spec = parse_repo(model_id)
    removed = False
    for path in _flat_files(cache, spec.repo, spec.tag):
        for suffix in _LEFTOVERS:
            removed |= _unlink(path.with_name(path.name + suffix))
    removed |= _unlink(manifest_path(cache, spec.repo, spec.tag))
    hub = find_hub_model(cache, spec.repo, spec.tag)
    if hub is not None:
        blob = hub.path.resolve() if hub.path.is_symlink() else None
        removed |= _unlink(hub.path)
        if blob is not None:
            removed |= _unlink(blob)
    return removed


def check_downloadable(client: httpx.Client, endpoint: str, model_id: str, token: str | None) -> list[str]:
    """The repo files `ORG/NAME[:TAG]` means, asked of the hub; DownloadError when it names none."""
    spec = parse_repo(model_id)
    return pick_files(list_repo_files(client, endpoint, spec.repo, token), spec.tag, spec.repo)
