"""What docs/architecture.md and README.md name still exists: every backticked file or folder
path, and every backticked class-like name (`EngineClient`, `SamplingParams`).

Paths are tried from the repository root and from `llamaserve/`; a one-part folder (`x/`) only
where it heads a row of the module map; a bare file name in a row of the module map
(`| `cli/` | ... `options.py` ...`) is looked for in that row's folder, and any other bare file
name anywhere in the repository. A class-like name must appear in our code or
tests (a third-party name we use appears where we import it).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = ("docs/architecture.md", "README.md")
TICKED = re.compile(r"`([^`\s]+)`")
PATHLIKE = re.compile(r"(?:[\w.-]+/)*[\w.-]+\.(?:py|md|sh|js|toml|css|html)|(?:[\w-]+/)+")
CLASSLIKE = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+")
ROW = re.compile(r"^\| `([^`]+)` \|")
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".rpc"}


@cache
def _all_names() -> frozenset[str]:
    names: set[str] = set()
    for path in REPO.rglob("*"):
        if not SKIP_DIRS.intersection(path.relative_to(REPO).parts):
            names.add(path.name)
    return frozenset(names)


@cache
def _our_source() -> str:
    files = [*(REPO / "llamaserve").rglob("*.py"), *(REPO / "tests").rglob("*.py")]
    return "\n".join(p.read_text(errors="replace") for p in files)


def _exists(token: str, row_folder: str | None) -> bool:
    token = token.rstrip("/") or token
    if "/" not in token and row_folder is not None and (REPO / "llamaserve" / row_folder / token).exists():
        return True
    if (REPO / token).exists() or (REPO / "llamaserve" / token).exists():
        return True
    if "/" not in token:
        return token in _all_names()
    if row_folder is not None:
        return (REPO / "llamaserve" / row_folder / token).exists()
    return False


def _missing(doc: str) -> tuple[list[str], list[str]]:
    paths: list[str] = []
    names: list[str] = []
    for line in (REPO / doc).read_text().splitlines():
        row = ROW.match(line)
        folder = None
        if row:
            first = row.group(1)
            folder = first if first.endswith("/") else str(Path(first).parent)
        for token in TICKED.findall(line):
            if token.endswith("/") and token.count("/") == 1 and not (row and token == row.group(1)):
                continue  # a bare `name/` in prose may be a folder made at run time (`files/`)
            if PATHLIKE.fullmatch(token) and not token.startswith(("../", "~")) and not _exists(token, folder):
                paths.append(token)
            elif CLASSLIKE.fullmatch(token) and not re.search(rf"\b{token}\b", _our_source()):
                names.append(token)
    return paths, names


@pytest.mark.parametrize("doc", DOCS)
def test_the_paths_a_doc_names_exist(doc: str) -> None:
    paths, _ = _missing(doc)
    assert paths == [], f"{doc} names files or folders that do not exist: {paths}"


@pytest.mark.parametrize("doc", DOCS)
def test_the_classes_a_doc_names_exist(doc: str) -> None:
    _, names = _missing(doc)
    assert names == [], f"{doc} names classes our code no longer has: {names}"


def test_the_check_catches_a_moved_module(tmp_path: Path) -> None:
    assert not _exists("api/no_such_module.py", None)
    assert _exists("api/app.py", None) and _exists("options.py", "cli")
    assert not re.search(r"\bSamplerConfig\b", _our_source())
