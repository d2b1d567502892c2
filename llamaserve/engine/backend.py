"""What the HTTP side needs from a loaded model, as protocols and plain data.

`llama/` implements these (`Model`, `Embedder`); `serving/` is written against
them, so it never imports llama.cpp and its tests can stand in fakes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # an annotation only: numpy stays off the path to the model's load (llama/__init__.py)
    import numpy as np


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the model that /props and /v1/models report."""

    path: str
    description: str
    ftype: str
    n_params: int
    size_bytes: int
    n_ctx_train: int
    n_embd: int
    n_vocab: int
    vocab_type: int
    has_encoder: bool
    has_decoder: bool


class Vocabulary(Protocol):
    """A model's vocabulary: read-only after loading, safe to use from any thread."""

    @property
    def n_vocab(self) -> int: ...

    @property
    def bos(self) -> int: ...

    @property
    def eos(self) -> int: ...

    @property
    def sep(self) -> int: ...

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def piece(self, token: int, *, special: bool = False) -> bytes: ...

    def token_text(self, token: int) -> str: ...

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str: ...

    def valid_token(self, token: int) -> bool: ...

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token (what ignore_eos bans)."""
        ...

    def fim_tokens(self) -> dict[str, int]: ...

    def check_grammar(self, grammar: str, triggers: tuple[str, ...] = ()) -> None:
        """Parse a GBNF grammar against this vocabulary; GrammarError when it is rejected."""
        ...


class EmbedError(ValueError):
    """An input cannot be embedded (too long for one micro-batch, empty, …)."""


class Embedder(Protocol):
    """Pooled or per-token vectors; `embed` runs on the scheduler thread."""

    @property
    def pooled(self) -> bool: ...

    # llama_decode (or llama_encode) calls made so far: /metrics counts them with the scheduler's.
    decodes: int

    def check(self, tokens: list[int]) -> None:
        """EmbedError when this input cannot be embedded."""
        ...

    def embed(self, inputs: list[list[int]]) -> list[np.ndarray]: ...


# ---------------------------------------------------------------- media
# A prompt with images or audio is still a list of ints: each position a media chunk
# occupies holds a negative placeholder, -(1 + slot * MEDIA_SPAN + k) for its k-th
# embedding, where ``slot`` names the encoded media in the runner's store and is
# derived from the media's content hash. So the same image in the same place gives
# the same placeholders, and prefix matching, the host-memory cache and slot files
# reuse its KV exactly as they reuse text (llama-server keys cached media by hash too),
# while a different image differs at its first position. Text tokens are never negative.
MEDIA_SPAN = 1 << 14  # the most embeddings one media chunk may have
MEDIA_SLOTS = (1 << 31) // MEDIA_SPAN - 1


def media_token(slot: int, k: int) -> int:
    return -(1 + slot * MEDIA_SPAN + k)


def media_slot(token: int) -> tuple[int, int]:
    """(store slot, embedding index) of a placeholder token."""
    n = -token - 1
    return n // MEDIA_SPAN, n % MEDIA_SPAN


class MediaError(ValueError):
    """A media input cannot be used: undecodable, of a kind the model does not take, too large."""


class MediaTokenizer(Protocol):
    """A model's multimodal projector as the HTTP side sees it (thread-safe)."""

    @property
    def vision(self) -> bool: ...

    @property
    def audio(self) -> bool: ...

    @property
    def video(self) -> bool:
        """Videos are taken (as sampled frames): vision, and a libmtmd built with video support."""
        ...

    @property
    def marker(self) -> str:
        """The text that stands for one media item in a prompt."""
        ...

    def tokenize(self, text: str, media: list[bytes], *, add_special: bool, parse_special: bool = True) -> list[int]:
        """The prompt's tokens, each marker replaced by its media's placeholders (encoded
        beforehand, so the scheduler only decodes them); MediaError for bad media."""
        ...
