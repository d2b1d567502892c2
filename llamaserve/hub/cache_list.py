"""`--cache-list`: the `-hf` models in the cache, printed as llama-server prints them.

llama.cpp (`common_list_cached_models`) lists one `<user>/<model>:<TAG>` per
repo and quant among the cached GGUF files: the tag is read off the file name
(the last `-` or `.` word before `.gguf` and any split suffix, upper-cased),
only a split's first part counts, files without such a tag and side files
(mmproj, mtp-, eagle3-, dflash-, dspark-) are skipped, and each `repo:TAG`
appears once. Docker (`-dr`) models are not listed, as in llama.cpp.

Our cache is flat (`user_model_<file>`), where `_` is ambiguous, so a file's
repo is known only from a manifest (`manifest=user=model=tag.json`) that an
`-hf` download wrote; a file downloaded only with `--hf-file` has none and is
not listed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from llamaserve.hub.cache import repo_prefix

_MANIFEST = re.compile(r"^manifest=([^=]+)=([^=]+)=[^=]+\.json$")
# llama.cpp's get_gguf_split_info: the split suffix, then the tag at the end of what is left.
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.IGNORECASE)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)
_SIDE_FILES = ("mmproj", "mtp-", "eagle3-", "dflash-", "dspark-")


def gguf_tag(name: str) -> str | None:
    """The quant tag llama.cpp reads off a GGUF name (`m-Q4_K_M.gguf` → Q4_K_M); None when not listed."""
    if not name.endswith(".gguf"):
        return None
    prefix = name[: -len(".gguf")]
    split = _SPLIT.match(prefix)
    if split:
        if int(split.group(2)) != 1:
            return None
        prefix = split.group(1)
    if any(side in prefix for side in _SIDE_FILES):
        return None
    tag = _TAG.search(prefix)
    return tag.group(1).upper() if tag else None


def _manifest_repos(names: list[str]) -> list[str]:
    repos = {f"{m.group(1)}/{m.group(2)}" for m in map(_MANIFEST.match, names) if m}
    # Longest first: a file of `a/b_c` also starts with `a/b`'s prefix `a_b_`.
    return sorted(repos, key=lambda r: (-len(r), r))


def list_cached_models(cache: Path) -> list[str]:
    """`<user>/<model>:<TAG>` for each model the cache holds, sorted by repo then file name."""
    try:
        names = sorted(p.name for p in cache.iterdir() if p.is_file())
    except OSError:
        return []
    repos = _manifest_repos(names)
    found: list[tuple[str, str, str]] = []
    for name in names:
        repo = next((r for r in repos if name.startswith(repo_prefix(r))), None)
        tag = gguf_tag(name[len(repo_prefix(repo)) :]) if repo else None
        if repo and tag:
            found.append((repo, name, tag))
    seen: set[str] = set()
    models: list[str] = []
    for repo, _name, tag in sorted(found):
        model = f"{repo}:{tag}"
        if model not in seen:
            seen.add(model)
            models.append(model)
    return models


def format_cache_list(models: Sequence[str]) -> str:
    """llama-server's `--cache-list` text: `printf("number of models in cache: %zu\\n")`, then `"%4zu. %s\\n"`."""
    lines = [f"number of models in cache: {len(models)}"]
    lines += [f"{i:4d}. {model}" for i, model in enumerate(models, 1)]
    return "\n".join(lines) + "\n"
