"""Where downloaded models live, and what a repo's earlier download left there.

The layout follows llama.cpp's flat cache: a file of repo `user/model` is
`<cache>/user_model_<file>` (slashes in the file's path become `_` too), a
`--model-url` download keeps the URL's last path segment, and the file an
`-hf user/model:tag` request picked is remembered in
`manifest=user=model=tag.json` so a later start knows which file that request
means without asking the hub. A `-dr repo/model:tag` Docker model is
`<cache>/repo_model_tag.gguf`, the name llama.cpp gives it.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

PART_SUFFIX = ".part"  # an incomplete download; the name without it appears only when whole


def cache_dir(environ: Mapping[str, str]) -> Path:
    """`LLAMA_CACHE`, else the platform's user cache directory + `llama.cpp` (as llama.cpp does)."""
    if environ.get("LLAMA_CACHE"):
        return Path(environ["LLAMA_CACHE"]).expanduser()
    if environ.get("XDG_CACHE_HOME"):
        return Path(environ["XDG_CACHE_HOME"]).expanduser() / "llama.cpp"
    home = Path(environ.get("HOME") or Path.home())
    if sys.platform == "darwin":
        return home / "Library" / "Caches" / "llama.cpp"
    return home / ".cache" / "llama.cpp"


def repo_prefix(repo: str) -> str:
    """`user/model` → `user_model_`: the start of every cached file of that repo."""
    return repo.replace("/", "_") + "_"


def hf_cache_path(cache: Path, repo: str, rfilename: str) -> Path:
    return cache / (repo_prefix(repo) + rfilename.replace("/", "_"))


def url_cache_path(cache: Path, url: str) -> Path:
    """The URL's last path segment, unquoted; query strings (signed URLs) are not part of the name."""
    name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rstrip("/").rpartition("/")[2])
    if not name or name in (".", ".."):
        name = "model.gguf"
    return cache / name.replace(os.sep, "_")


def docker_cache_path(cache: Path, repo: str, tag: str) -> Path:
    """llama.cpp's name for a Docker Hub model: every `/` of the repo becomes `_`, then `_<tag>.gguf`."""
    return cache / f"{repo.replace('/', '_')}_{tag}.gguf"


def manifest_path(cache: Path, repo: str, tag: str | None) -> Path:
    user, _, model = repo.partition("/")
    return cache / f"manifest={user}={model}={tag or 'latest'}.json"


def read_manifest(cache: Path, repo: str, tag: str | None) -> list[str] | None:
    """The repo files an earlier download picked for this request (primary first), if recorded."""
    try:
        data = json.loads(manifest_path(cache, repo, tag).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    files = data.get("llamaserve", {}).get("files") if isinstance(data, dict) else None
    if isinstance(files, list) and files and all(isinstance(f, str) for f in files):
        return files
    primary = data.get("ggufFile", {}).get("rfilename") if isinstance(data, dict) else None
    return [primary] if isinstance(primary, str) else None


def write_manifest(cache: Path, repo: str, tag: str | None, files: list[str]) -> None:
    # `ggufFile.rfilename` is the key llama.cpp's own manifest used for the primary file.
    data = {"ggufFile": {"rfilename": files[0]}, "llamaserve": {"files": files}}
    path = manifest_path(cache, repo, tag)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def cached_repo_files(cache: Path, repo: str) -> list[str]:
    """Complete files of `repo` in the cache, as names relative to the repo prefix.

    The prefix flattens subfolders, so the names come back with `_` where the
    repo had `/`; they serve only to pick a file again when the hub cannot be asked.
    """
    prefix = repo_prefix(repo)
    try:
        names = sorted(p.name for p in cache.iterdir() if p.is_file())
    except OSError:
        return []
    return [n[len(prefix) :] for n in names if n.startswith(prefix) and n.lower().endswith(".gguf")]
