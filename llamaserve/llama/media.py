"""Media prompts: text plus images/audio → placeholder tokens, and the store of encoded media.

`MediaPrompter` implements `engine.backend.MediaTokenizer`. A prompt's media
are encoded when it is tokenized, on the caller's worker thread, and their
embeddings kept in `MediaStore` under a slot derived from the media's SHA-256;
the prompt carries placeholders naming (slot, row) (see `engine/backend.py`).
The runner then only copies rows into an embeddings batch, so a slot whose
prompt holds an image costs the scheduler one decode of that many rows, never
an encoder pass. The same file twice is encoded once while its entry lives.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llamaserve.engine.backend import MEDIA_SLOTS, MEDIA_SPAN, MediaError, media_slot, media_token

if TYPE_CHECKING:  # libmtmd loads with a projector only (llama/mtmd.py; -mm): not on every start
    from llamaserve.llama.mtmd import Projector


@dataclass
class Encoded:
    media_id: str
    embeddings: np.ndarray  # (n_tokens, n_embd) float32
    non_causal: bool
    n_pos: int = 0  # positions the media takes in its sequence; 0: one per embedding
    # M-RoPE (Qwen2-VL family): each row's four positions for the media at position 0, and
    # their gain per position it starts further on (see `Projector._sections`).
    sections: np.ndarray | None = None
    section_steps: np.ndarray | None = None

    def positions(self, k: int, base: int) -> np.ndarray:
        """Row k's four M-RoPE positions for the media placed at ``base``."""
        assert self.sections is not None and self.section_steps is not None
        row: np.ndarray = self.sections[k] + base * self.section_steps[k]
        return row


class MediaStore:
    """Encoded media by store slot, least recently used dropped past ``max_bytes``."""

    def __init__(self, max_bytes: int = 512 << 20) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._by_slot: OrderedDict[int, Encoded] = OrderedDict()
        self._slot_of: dict[str, int] = {}
        # Which media each slot number was ever given to. KV computed for a media's
        # placeholders can outlive the media's entry (slots, the host-memory cache), so a slot
        # number is never handed to a different media: the same placeholders always mean the
        # same content, and an evicted media that comes back gets its old number again.
        self._owner: dict[int, str] = {}
        # (n_tokens, n_pos) of each slot number ever given, kept like _owner: the positions of
        # text after a media in a KV sequence depend on it after the embeddings are gone.
        self._shape: dict[int, tuple[int, int]] = {}
        self._bytes = 0
        self.encodes = 0  # encoder passes so far (tests and /metrics-style checks)

    def find(self, media_id: str) -> int | None:
        with self._lock:
            slot = self._slot_of.get(media_id)
            if slot is not None:
                self._by_slot.move_to_end(slot)
            return slot

    def put(self, entry: Encoded) -> int:
        """Store an encoded media; returns its slot (stable while the entry lives)."""
        with self._lock:
            known = self._slot_of.get(entry.media_id)
            if known is not None:
                return known
            # A slot from the hash, probing past numbers given to other media.
            slot = int(hashlib.sha256(entry.media_id.encode()).hexdigest()[:12], 16) % MEDIA_SLOTS
            probes = 0
            while self._owner.setdefault(slot, entry.media_id) != entry.media_id:
                slot = (slot + 1) % MEDIA_SLOTS
                probes += 1
                if probes >= MEDIA_SLOTS:
                    raise MediaError("this server has seen too many distinct media; restart it")
            self._by_slot[slot] = entry
            self._slot_of[entry.media_id] = slot
            n_tokens = len(entry.embeddings)
            self._shape[slot] = (n_tokens, entry.n_pos or n_tokens)
            self._bytes += entry.embeddings.nbytes
            while self._bytes > self.max_bytes and len(self._by_slot) > 1:
                _, old = self._by_slot.popitem(last=False)
                del self._slot_of[old.media_id]
                self._bytes -= old.embeddings.nbytes
            return slot

    def row(self, token: int) -> tuple[np.ndarray, bool] | None:
        """The embedding a placeholder stands for, and whether its media wants full attention."""
        found = self.entry(token)
        return None if found is None else (found[0].embeddings[found[1]], found[0].non_causal)

    def entry(self, token: int) -> tuple[Encoded, int] | None:
        """The encoded media a placeholder names, and which of its rows."""
        slot, k = media_slot(token)
        with self._lock:
            entry = self._by_slot.get(slot)
        if entry is None or k >= len(entry.embeddings):
            return None
        return entry, k

    def shape(self, token: int) -> tuple[int, int] | None:
        """(n_tokens, n_pos) of the media a placeholder names, known even after its entry is dropped."""
        with self._lock:
            return self._shape.get(media_slot(token)[0])


class MediaPrompter:
    """A projector and its store, as the HTTP side's `MediaTokenizer`."""

    def __init__(self, projector: Projector, store: MediaStore) -> None:
        from llamaserve.llama import mtmd  # already loaded: the projector comes from it

        self.projector = projector
        self.store = store
        self._text_kind = mtmd.CHUNK_TEXT

    @property
    def vision(self) -> bool:
        return self.projector.vision

    @property
    def audio(self) -> bool:
        return self.projector.audio

    @property
    def video(self) -> bool:
        return self.projector.video

    @property
    def marker(self) -> str:
        return self.projector.marker

    def tokenize(self, text: str, media: list[bytes], *, add_special: bool, parse_special: bool = True) -> list[int]:
        chunks = self.projector.tokenize(text, media, add_special=add_special, parse_special=parse_special)
        try:
            tokens: list[int] = []
            for chunk in chunks:
                if chunk.kind == self._text_kind:
                    tokens += chunk.tokens
                    continue
                if chunk.n_tokens > MEDIA_SPAN:
                    raise MediaError(f"a media item needs {chunk.n_tokens} tokens; at most {MEDIA_SPAN} are supported")
                slot = self.store.find(chunk.media_id)
                if slot is None:
                    embd = self.projector.encode(chunk)
                    self.store.encodes += 1
                    slot = self.store.put(
                        Encoded(
                            chunk.media_id,
                            embd,
                            chunk.non_causal,
                            n_pos=chunk.n_pos,
                            sections=chunk.sections,
                            section_steps=chunk.section_steps,
                        )
                    )
                tokens += [media_token(slot, k) for k in range(chunk.n_tokens)]
            return tokens
        finally:
            self.projector.release(chunks)
