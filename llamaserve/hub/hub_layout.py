"""Models in the Hugging Face hub's cache layout, which llama.cpp's router also lists.

`<cache>/models--ORG--NAME/snapshots/<revision>/<file>.gguf`, the revision named by
`refs/main` (else any snapshot). Each model file gives one `ORG/NAME:TAG` entry, the tag
read off the file name as `--cache-list` reads it; side files (mmproj, drafts) and the
later parts of a split model are not entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamaserve.hub.cache_list import gguf_tag


@dataclass(frozen=True)
class HubModel:
    id: str  # ORG/NAME:TAG
    repo: str  # ORG/NAME
    path: Path


def _snapshot(repo_dir: Path) -> Path | None:
    ref = repo_dir / "refs" / "main"
    try:
        revision = ref.read_text(encoding="utf-8").strip()
    except OSError:
        revision = ""
    snaps = repo_dir / "snapshots"
    if revision and (snaps / revision).is_dir():
        return snaps / revision
    try:
        found = sorted(p for p in snaps.iterdir() if p.is_dir())
    except OSError:
        return None
    return found[0] if found else None


def list_hub_models(cache: Path) -> list[HubModel]:
    """Every GGUF model of the hub layout under `cache`, sorted by id."""
    try:
        repos = sorted(p for p in cache.iterdir() if p.is_dir() and p.name.startswith("models--"))
    except OSError:
        return []
    out: dict[str, HubModel] = {}
    for repo_dir in repos:
        org, _, name = repo_dir.name[len("models--") :].partition("--")
        if not org or not name:
            continue
        snap = _snapshot(repo_dir)
        if snap is None:
            continue
        repo = f"{org}/{name}"
        for file in sorted(snap.rglob("*.gguf")):
            tag = gguf_tag(file.name)
            if tag and file.is_file():
                out.setdefault(f"{repo}:{tag}", HubModel(f"{repo}:{tag}", repo, file))
    return [out[k] for k in sorted(out)]


def find_hub_model(cache: Path, repo: str, tag: str | None = None) -> HubModel | None:
    """The cached file for `-hf ORG/NAME[:TAG]` (the repo's only or first file when no tag)."""
    if ":" in repo and tag is None:
        repo, _, tag = repo.partition(":")
    models = [m for m in list_hub_models(cache) if m.repo == repo]
    if tag:
        models = [m for m in models if m.id.endswith(":" + tag.upper())]
    return models[0] if models else None
