"""The media store's slot numbers: stable per content, never reused for other content."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np

from llamaserve.engine.backend import MEDIA_SLOTS
from llamaserve.llama.media import Encoded, MediaStore


def hashed_slot(media_id: str) -> int:
    return int(hashlib.sha256(media_id.encode()).hexdigest()[:12], 16) % MEDIA_SLOTS


def encoded(media_id: str) -> Encoded:
    return Encoded(media_id, np.zeros((4, 8), dtype=np.float32), non_causal=False)


def test_an_evicted_media_number_never_goes_to_other_content() -> None:
    first = "image-a"
    # Another id whose hash lands on the same number: found by trying ids in turn.
    other = next(
        f"image-{i}"
        for i in itertools.count()
        if f"image-{i}" != first and hashed_slot(f"image-{i}") == hashed_slot(first)
    )
    store = MediaStore(max_bytes=200)  # room for one entry: each put evicts the last one
    slot_a = store.put(encoded(first))
    slot_b = store.put(encoded(other))
    assert store.find(first) is None  # evicted
    # KV computed for the first image's placeholders may still be cached: the other image must
    # not get the same placeholders, and the first one gets its old number back.
    assert slot_b != slot_a
    assert store.put(encoded(first)) == slot_a
