"""Every field our request models declare is read by the code that serves it.

An accepted-but-ignored parameter is a bug: a field is either used or refused
with a 400 (by its validator). This scans serving/, api/ and the API families' serving
and route modules for each declared
field name, as an attribute (`req.top_k`) or a key (`"top_k"`), so a field
added to a model and forgotten by the serving code fails here. Fields we do
not declare are ignored, as llama-server ignores them (tests/server/test_contract.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llamaserve.engine.sampling import SCALAR_KNOBS
from tests.fuzz_bodies import declared_fields

ROOT = Path(__file__).resolve().parents[2] / "llamaserve"


def _serving_source() -> str:
    """serving/, api/ and each API family's code but its request models (they declare the names)."""
    paths = [p for part in ("serving", "api") for p in sorted((ROOT / part).rglob("*.py"))]
    paths += [p for p in sorted((ROOT / "families").rglob("*.py")) if p.name != "protocol.py"]
    return "\n".join(p.read_text() for p in paths)


SOURCE = _serving_source()
READ = set(re.findall(r"\.(\w+)\b", SOURCE)) | set(re.findall(r"[\"'](\w+)[\"']", SOURCE))
# serving/params.py copies the plain sampling knobs by name, through SCALAR_KNOBS.
assert "SCALAR_KNOBS" in SOURCE
READ |= set(SCALAR_KNOBS)


@pytest.mark.parametrize("field", declared_fields())
def test_declared_field_is_read(field: str) -> None:
    assert field in READ, f"{field!r} is declared by a request model but the serving code never reads it"


def test_the_scan_is_not_vacuous() -> None:
    assert "top_k" in READ and "no_such_field_anywhere" not in READ
    assert len(declared_fields()) > 80
