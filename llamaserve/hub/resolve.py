"""`-hf` / `--model-url` → a local GGUF path, before the server starts.

The cache is looked at first: a request whose file(s) are already complete in
the cache is served from there without any network access, so a second start
works with the hub down. (The price: a repo updated upstream is not noticed;
delete the cached file to fetch it again.) `--offline` never touches the
network. When the hub cannot be reached and the request has not been seen
before, the same file-picking rules run over the repo's cached files.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from llamaserve.config import ServerConfig
from llamaserve.hub.cache import (
    cache_dir,
    cached_repo_files,
    hf_cache_path,
    read_manifest,
    url_cache_path,
    write_manifest,
)
from llamaserve.hub.errors import DownloadError, HubUnreachable
from llamaserve.hub.fetch import ProgressHook, download
from llamaserve.hub.hf import file_url, hub_endpoint, list_repo_files
from llamaserve.hub.select import RepoSpec, parse_repo, pick_files, split_parts

USER_AGENT = "llamaserve/0.1 (llama-server compatible)"
# Connect fails fast when the network is down; reads may stall on a slow CDN.
TIMEOUT = httpx.Timeout(60.0, connect=15.0)


def _say(text: str) -> None:
    # Logging is not set up yet at this point of startup; stderr is where llama-server reports too.
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()


def _client() -> httpx.Client:
    return httpx.Client(follow_redirects=True, timeout=TIMEOUT, headers={"User-Agent": USER_AGENT})


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: the plain values of `-hf`, `-hff`, `-hft`, `-mu`, `-m` and `--offline`.

    The server resolves one from its `ServerConfig`; `llama download` builds one from its own
    arguments, so both follow the same cache and download rules.
    """

    hf_repo: str | None = None  # <user>/<model>[:quant]
    hf_file: str | None = None
    hf_token: str | None = None
    model_url: str | None = None
    model: str = ""  # with hf_repo or model_url: where the file is stored instead of the cache
    offline: bool = False
    docker_repo: str | None = None  # -dr [<repo>/]<model>[:tag]

    @classmethod
    def of(cls, config: ServerConfig) -> ModelSource:
        return cls(
            hf_repo=config.hf_repo,
            hf_file=config.hf_file,
            hf_token=config.hf_token,
            model_url=config.model_url,
            model=config.model,
            offline=config.offline,
            docker_repo=config.docker_repo,
        )


def resolve_model(config: ServerConfig, environ: Mapping[str, str]) -> str:
    """The local path of the model `config` names, downloading it if needed (see `fetch_model`)."""
    return fetch_model(ModelSource.of(config), environ)


def resolve_draft_model(config: ServerConfig, environ: Mapping[str, str]) -> str:
    """The local path of the draft model `-hfd` names, downloading it if needed.

    As llama-server: `-md` given with `-hfd` names the file of the repo (the -spec presets name it
    too), and the file goes to the cache like any `-hf` download; `--offline` and `-hft` apply.
    """
    spec = config.spec
    source = ModelSource(
        hf_repo=spec.draft_hf_repo,
        hf_file=spec.draft_hf_file or spec.draft_model,
        hf_token=config.hf_token,
        offline=config.offline,
    )
    return fetch_model(source, environ)


def fetch_model(source: ModelSource, environ: Mapping[str, str], hook: ProgressHook | None = None) -> str:
    """The local path of the model `source` names, downloading it if needed.

    `-dr` wins over `-hf`, which wins over `--model-url`, as in llama-server. A `-m` given with either
    is where the file is stored instead of the cache. Raises `DownloadError`. `hook` hears each
    file's progress (`-hf` and `--model-url` downloads) and may stop it by raising.
    """
    if source.docker_repo:
        from llamaserve.hub.docker import resolve_docker  # here: docker.py takes its HTTP settings from this module

        return resolve_docker(source.docker_repo, cache=cache_dir(environ), offline=source.offline, environ=environ)
    if source.hf_repo:
        return _resolve_hf(source, environ, hook)
    if source.model_url:
        return _resolve_url(source, environ, hook)
    return source.model


def _resolve_url(source: ModelSource, environ: Mapping[str, str], hook: ProgressHook | None) -> str:
    url = source.model_url or ""
    if not url.lower().startswith(("http://", "https://")):
        raise DownloadError(f"--model-url must be an http(s) URL, got '{url}'")
    dest = Path(source.model) if source.model else url_cache_path(cache_dir(environ), url)
    if dest.is_file():
        _say(f"model: using cached {dest}")
        return str(dest)
    if source.offline:
        raise DownloadError(f"--offline: {url} is not in the cache (looked for {dest})")
    _say(f"model: downloading {url} -> {dest}")
    with _client() as client:
        download(client, url, dest, token=source.hf_token, hook=hook)
    return str(dest)


def _destinations(source: ModelSource, cache: Path, repo: str, files: list[str]) -> list[Path]:
    """Where each of `files` goes: the cache, or beside `-m` (which must then name part 1 of a split)."""
    if not source.model:
        return [hf_cache_path(cache, repo, f) for f in files]
    paths = split_parts(source.model)
    if len(paths) != len(files):
        raise DownloadError(
            f"-m with a split model ({len(files)} parts) must name its first part as "
            f"<name>-00001-of-{len(files):05d}.gguf"
        )
    return [Path(p) for p in paths]


def _known_paths(source: ModelSource, cache: Path, spec: RepoSpec) -> list[Path] | None:
    """The local files this request means without asking the hub: -m, --hf-file, or the manifest."""
    if source.model:
        return [Path(p) for p in split_parts(source.model)]
    names = split_parts(source.hf_file) if source.hf_file else read_manifest(cache, spec.repo, spec.tag)
    return _destinations(source, cache, spec.repo, names) if names else None


def _all_present(paths: list[Path]) -> bool:
    return all(p.is_file() for p in paths)


def _from_cache_listing(source: ModelSource, cache: Path, spec: RepoSpec) -> Path | None:
    """Pick among the repo's cached files with the hub's rules; None when nothing fits."""
    if source.model:
        paths = [Path(p) for p in split_parts(source.model)]
        return paths[0] if _all_present(paths) else None
    try:
        files = pick_files(cached_repo_files(cache, spec.repo), spec.tag, spec.repo)
    except DownloadError:
        return None
    paths = _destinations(source, cache, spec.repo, files)
    return paths[0] if _all_present(paths) else None


def _resolve_hf(source: ModelSource, environ: Mapping[str, str], hook: ProgressHook | None) -> str:
    spec = parse_repo(source.hf_repo or "")
    cache = cache_dir(environ)
    endpoint = hub_endpoint(environ)
    what = spec.repo + (f":{spec.tag}" if spec.tag else "") + (f" ({source.hf_file})" if source.hf_file else "")

    # 1. This exact request was resolved before (or names its file): use the cache as is.
    known = _known_paths(source, cache, spec)
    if known and _all_present(known):
        _say(f"model: using cached {known[0]}")
        return str(known[0])
    if source.offline:
        cached = None if source.hf_file else _from_cache_listing(source, cache, spec)
        if cached is None:
            raise DownloadError(
                f"--offline: {what} is not in the cache ({cache}); run once without --offline to download it"
            )
        _say(f"model: using cached {cached} (offline)")
        return str(cached)

    with _client() as client:
        # 2. Ask the hub which file(s) the request means; --hf-file needs no listing.
        if source.hf_file:
            files = split_parts(source.hf_file)
        else:
            try:
                listing = list_repo_files(client, endpoint, spec.repo, source.hf_token)
            except HubUnreachable as exc:
                cached = _from_cache_listing(source, cache, spec)
                if cached is None:
                    raise
                _say(f"model: {exc}; using cached {cached}")
                return str(cached)
            files = pick_files(listing, spec.tag, spec.repo)
        # 3. Download what is missing (a split model part by part).
        paths = _destinations(source, cache, spec.repo, files)
        for name, path in zip(files, paths):
            if path.is_file():
                continue
            url = file_url(endpoint, spec.repo, name)
            _say(f"model: downloading {url} -> {path}")
            download(client, url, path, token=source.hf_token, label=name.rsplit("/", 1)[-1], hook=hook)
    if not source.hf_file and not source.model:
        write_manifest(cache, spec.repo, spec.tag, files)
    return str(paths[0])
