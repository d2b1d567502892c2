"""Which GGUF file(s) of a repo an `-hf user/model[:quant]` request means.

Pure functions over file names, so the same rules pick from the hub's listing
and, when the hub cannot be reached, from what the cache holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from llamaserve.hub.errors import DownloadError

DEFAULT_QUANT = "Q4_K_M"

# llama.cpp's split naming (`gguf-split`): <prefix>-00001-of-00003.gguf
_SPLIT = re.compile(r"^(?P<prefix>.*)-(?P<idx>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_REPO = re.compile(r"^[\w.-]+/[\w.-]+$")


@dataclass(frozen=True)
class RepoSpec:
    repo: str  # user/model
    tag: str | None  # the quant after ':', None when not given


def parse_repo(text: str) -> RepoSpec:
    repo, sep, tag = text.strip().partition(":")
    if not _REPO.match(repo) or (sep and not tag):
        raise DownloadError(f"--hf-repo must look like <user>/<model>[:quant], got '{text}'")
    # ":latest" is llama.cpp's name for "no tag" (the default quant).
    return RepoSpec(repo, None if tag.lower() in ("", "latest") else tag)


def split_parts(name: str) -> list[str]:
    """All parts of a split GGUF given any one of them, first part first; `[name]` if not split."""
    m = _SPLIT.match(name)
    if not m:
        return [name]
    count = int(m.group("count"))
    ext = name[-5:]  # keep the case of ".gguf" as the repo spells it
    return [f"{m.group('prefix')}-{i:05d}-of-{m.group('count')}{ext}" for i in range(1, count + 1)]


def is_model_gguf(name: str) -> bool:
    """A .gguf that is not a multimodal projector (mmproj files are never the model)."""
    base = name.rsplit("/", 1)[-1].lower()
    return base.endswith(".gguf") and "mmproj" not in base


def _matches_tag(name: str, tag: str) -> bool:
    return tag.lower() in name.lower()


def _matches_tag_exactly(name: str, tag: str) -> bool:
    # Bounded so that "Q4_K" does not take "Q4_K_M" when both exist.
    pattern = r"(?<![A-Za-z0-9_])" + re.escape(tag) + r"(?![A-Za-z0-9_])"
    return re.search(pattern, name, re.IGNORECASE) is not None


def pick_files(files: list[str], tag: str | None, repo: str) -> list[str]:
    """The file(s) to fetch for `repo[:tag]` from its file list, primary (first split part) first.

    An explicit tag must match a file name case-insensitively (a whole-word
    match wins over a substring match); without a tag, Q4_K_M is tried and
    otherwise the first GGUF in the listing is taken, as llama-server does.
    A split model is every one of its parts; a listing that lacks a part is an error.
    """
    ggufs = [f for f in files if is_model_gguf(f)]
    if not ggufs:
        raise DownloadError(f"repo {repo} has no GGUF model file")
    want = tag or DEFAULT_QUANT
    chosen = next((f for f in ggufs if _matches_tag_exactly(f, want)), None)
    if chosen is None:
        chosen = next((f for f in ggufs if _matches_tag(f, want)), None)
    if chosen is None:
        if tag is not None:
            names = ", ".join(ggufs[:12]) + (" ..." if len(ggufs) > 12 else "")
            raise DownloadError(f"repo {repo} has no GGUF file matching quant '{tag}' (files: {names})")
        chosen = ggufs[0]
    parts = split_parts(chosen)
    missing = [p for p in parts if p not in files]
    if missing:
        raise DownloadError(f"repo {repo}: split model {parts[0]} lacks part(s) {', '.join(missing)}")
    return parts


# llama.cpp prefers the projector of the highest precision a repo offers.
_MMPROJ_PREFERENCE = ("f16", "bf16", "f32", "q8_0")


def pick_mmproj(files: list[str]) -> str | None:
    """The multimodal projector among a repo's files (mmproj*.gguf), None when it has none."""
    projs = [f for f in files if f.lower().endswith(".gguf") and "mmproj" in f.rsplit("/", 1)[-1].lower()]
    for want in _MMPROJ_PREFERENCE:
        hit = next((f for f in projs if _matches_tag_exactly(f, want)), None)
        if hit is not None:
            return hit
    return projs[0] if projs else None
