"""The multimodal projector's file: `-mm`, `-mmu URL` (downloaded once into the cache) or, with
`-hf`, the repo's own mmproj file unless `--no-mmproj` (llama-server's `--mmproj-auto`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from llamaserve.config import ServerConfig
from llamaserve.hub.cache import cache_dir, cached_repo_files, hf_cache_path, url_cache_path
from llamaserve.hub.errors import DownloadError, HubUnreachable
from llamaserve.hub.fetch import download
from llamaserve.hub.hf import file_url, hub_endpoint, list_repo_files
from llamaserve.hub.resolve import _client, _say
from llamaserve.hub.select import parse_repo, pick_mmproj


def resolve_mmproj(config: ServerConfig, environ: Mapping[str, str]) -> str | None:
    """The local projector path, or None when the model runs without one."""
    cache = cache_dir(environ)
    if config.mmproj_url:
        url = config.mmproj_url
        if not url.lower().startswith(("http://", "https://")):
            raise DownloadError(f"--mmproj-url must be an http(s) URL, got '{url}'")
        dest = Path(config.mmproj) if config.mmproj else url_cache_path(cache, url)
        if dest.is_file():
            return str(dest)
        if config.offline:
            raise DownloadError(f"--offline: {url} is not in the cache (looked for {dest})")
        _say(f"mmproj: downloading {url} -> {dest}")
        with _client() as client:
            download(client, url, dest, token=config.hf_token)
        return str(dest)
    if config.mmproj or not (config.hf_repo and config.mmproj_auto):
        return config.mmproj
    repo = parse_repo(config.hf_repo).repo
    cached = pick_mmproj(cached_repo_files(cache, repo))
    if cached is not None and hf_cache_path(cache, repo, cached).is_file():
        return str(hf_cache_path(cache, repo, cached))
    if config.offline:
        return None
    endpoint = hub_endpoint(environ)
    with _client() as client:
        try:
            name = pick_mmproj(list_repo_files(client, endpoint, repo, config.hf_token))
        except HubUnreachable as exc:
            _say(f"mmproj: {exc}; starting without a projector")
            return None
        if name is None:
            return None
        dest = hf_cache_path(cache, repo, name)
        if not dest.is_file():
            url = file_url(endpoint, repo, name)
            _say(f"mmproj: downloading {url} -> {dest}")
            download(client, url, dest, token=config.hf_token, label=name.rsplit("/", 1)[-1])
    return str(dest)
