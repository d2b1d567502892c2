"""llama.cpp's own files that tests check against: the chat-template corpus and llama-server's README.

scripts/bootstrap copies them from the llama.cpp tree vendored in the llama-cpp-python sdist
(`vendor/llama.cpp/models/templates/*.jinja`, `vendor/llama.cpp/tools/server/README.md`) into
tests/data/llama.cpp/, which git ignores. A missing file is a broken setup, never a reason to skip:
the test that reads it fails, saying so.
"""

from __future__ import annotations

from pathlib import Path

LLAMA_CPP = Path(__file__).resolve().parent / "data" / "llama.cpp"
TEMPLATES = LLAMA_CPP / "models" / "templates"
SERVER_README = LLAMA_CPP / "tools" / "server" / "README.md"
SETUP = "scripts/bootstrap copies it from the llama-cpp-python sdist"


def template_names() -> list[str]:
    """The corpus's file names, sorted; empty when bootstrap has not run (see `read_template`)."""
    return sorted(p.name for p in TEMPLATES.glob("*.jinja"))


def read_template(name: str) -> str:
    """The text of one template of llama.cpp's corpus."""
    path = TEMPLATES / name
    assert path.is_file(), f"{path} is missing: {SETUP}"
    return path.read_text(encoding="utf-8")


def server_readme() -> str:
    """llama-server's README as llama.cpp ships it (the flag tables)."""
    assert SERVER_README.is_file(), f"{SERVER_README} is missing: {SETUP}"
    return SERVER_README.read_text(encoding="utf-8")
