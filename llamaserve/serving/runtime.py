"""The loaded model as the HTTP side sees it: vocabulary, template, engine client.

`llamaserve/compose.py` builds it from a ServerConfig (the one place that
knows llama.cpp is underneath); `serving/state.py` tells routes whether it
is loaded yet. The engine is reached only through its front, `engine` (an
`EngineClient`): generation, slot views, counters, slot files. The scheduler
behind it is not here, so no route can read its slots or caches directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llamaserve.chat.prompt_template import PromptTemplate
from llamaserve.chat.tools import ToolFormat, detect_format
from llamaserve.config import ServerConfig
from llamaserve.engine.backend import Embedder, MediaTokenizer, ModelInfo, Vocabulary
from llamaserve.engine.client import EngineClient
from llamaserve.errors import APIError
from llamaserve.serving.lora import LoraScales


@dataclass
class ModelRuntime:
    config: ServerConfig
    model: Vocabulary
    n_ctx_slot: int  # tokens of context per slot
    engine: EngineClient  # the engine's front: all the HTTP side may use of it
    template: PromptTemplate  # Jinja (chat/template.py) or one of llama.cpp's built-ins
    template_source: str  # the Jinja source, or a built-in's name (what /props shows, as llama-server)
    info: ModelInfo
    # Frees the native model, context and adapters; called once the scheduler has stopped.
    release: Callable[[], None]
    build_info: str  # llama-server's build_info and the OpenAI system_fingerprint
    created: int = field(default_factory=lambda: int(time.time()))
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    ui_settings: dict[str, Any] = field(default_factory=dict)
    embedder: Embedder | None = None
    media: MediaTokenizer | None = None  # with --mmproj: images and/or audio in prompts
    lora: LoraScales = field(default_factory=LoraScales)
    _tool_format: ToolFormat | None = None

    def require_generation(self) -> None:
        """Embedding and reranking servers do not generate, as in llama-server."""
        if self.embedder is not None:
            raise APIError(
                "This server does not support completions. Start it without `--embeddings`", "not_supported_error"
            )

    @property
    def tool_format(self) -> ToolFormat:
        """The tool-call format of this model's template (found once)."""
        if self._tool_format is None:
            self._tool_format = detect_format(self.template_source)
        return self._tool_format

    @property
    def modalities(self) -> dict[str, bool]:
        """What the model takes besides text, as /props reports it."""
        media = self.media
        return {
            "vision": bool(media and media.vision),
            "video": bool(media and media.video),
            "audio": bool(media and media.audio),
        }

    @property
    def alias(self) -> str:
        return self.config.model_alias

    def close(self) -> None:
        self.engine.stop()  # the scheduler thread ends, then --cache-persist writes the slots
        self.release()
