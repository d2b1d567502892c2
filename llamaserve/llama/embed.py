"""Embeddings and rerank scores from a context created with embeddings on.

Runs on the scheduler thread (through a `Call`), which owns the context.
Many inputs are packed into one decode, one sequence id each, within the
batch size and the number of sequences the context was made for.

An input with media (placeholders of `llama/media.py`, its embeddings already encoded into
the store) is decoded alone and in order, as llama-server's slot does: text, then the media's
embeddings into the KV cache, then the text after it. A pooled vector is what llama.cpp pools
over the last decode (the trailing text, which attends to the media before it); per-token
vectors are the text tokens'. M-RoPE media take their four positions each, and the text after
them moves on by the media's n_pos.
"""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as C
import numpy as np

from llamaserve.engine.backend import EmbedError
from llamaserve.llama.context import Context
from llamaserve.llama.media import MediaStore


class Embedder:
    def __init__(self, context: Context, media: MediaStore | None = None, *, mrope: bool = False) -> None:
        self.context = context
        self.media = media  # encoded media the inputs' placeholders name; None without --mmproj
        self.mrope = mrope
        model = context.model
        self.n_embd = int(C.llama_model_n_embd(model.handle))
        self.n_cls_out = max(1, int(C.llama_model_n_cls_out(model.handle)))
        self.pooling = int(C.llama_pooling_type(context.handle))
        self.encoder_only = bool(C.llama_model_has_encoder(model.handle)) and not bool(
            C.llama_model_has_decoder(model.handle)
        )
        self.n_ubatch = int(C.llama_n_ubatch(context.handle))
        self.decodes = 0  # llama_encode/llama_decode calls so far, for /metrics

    @property
    def pooled(self) -> bool:
        return self.pooling != C.LLAMA_POOLING_TYPE_NONE

    def check(self, tokens: list[int]) -> None:
        if not tokens:
            raise EmbedError("an input is empty")
        if len(tokens) > self.n_ubatch:
            raise EmbedError(
                f"input is too large to process ({len(tokens)} tokens); the physical batch size "
                f"(-ub) is {self.n_ubatch}"
            )

    def _run(self, group: list[list[int]]) -> list[np.ndarray]:
        rows = []
        for seq, tokens in enumerate(group):
            rows += [(tok, pos, seq, True) for pos, tok in enumerate(tokens)]
        ctx = self.context
        if ctx.memory:
            ctx.clear()
        batch = ctx.batch
        for i, (tok, pos, seq, want) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.seq_id[i][0], batch.logits[i] = tok, pos, seq, 1 if want else 0
        batch.n_tokens = len(rows)
        code = C.llama_encode(ctx.handle, batch) if self.encoder_only else C.llama_decode(ctx.handle, batch)
        self.decodes += 1
        if code != 0:
            raise RuntimeError(f"embedding decode failed with code {code}")
        out: list[np.ndarray] = []
        if self.pooled:
            width = self.n_cls_out if self.pooling == C.LLAMA_POOLING_TYPE_RANK else self.n_embd
            for seq in range(len(group)):
                ptr = C.llama_get_embeddings_seq(ctx.handle, seq)
                arr = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float * width)).contents
                out.append(np.array(arr, dtype=np.float32))
        else:
            start = 0
            for tokens in group:
                vecs = []
                for i in range(start, start + len(tokens)):
                    ptr = C.llama_get_embeddings_ith(ctx.handle, i)
                    vecs.append(
                        np.array(
                            ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float * self.n_embd)).contents, dtype=np.float32
                        )
                    )
                out.append(np.stack(vecs))
                start += len(tokens)
        if ctx.memory:
            ctx.clear()
        return out

    def _vectors(self, first: int, n: int) -> list[np.ndarray]:
        """Per-token vectors of batch rows first .. first + n - 1 of the last decode."""
        out = []
        for i in range(first, first + n):
            ptr = C.llama_get_embeddings_ith(self.context.handle, i)
            out.append(np.array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float * self.n_embd)).contents))
        return out

    def _run_media(self, tokens: list[int]) -> np.ndarray:
        """One input holding media: its runs of text and media decoded in order into sequence 0."""
        if self.media is None or self.encoder_only:
            raise EmbedError("this model cannot embed media")
        ctx = self.context
        ctx.clear()
        pos = 0  # the model position of the next row
        base = end = 0  # the current media's first position, and where the text after it starts
        text_vectors: list[np.ndarray] = []
        i = 0
        try:
            while i < len(tokens):
                j = i
                media = tokens[i] < 0
                while j < len(tokens) and (tokens[j] < 0) == media:
                    j += 1
                if not media:
                    code = ctx.decode([(tok, pos + k, 0, True) for k, tok in enumerate(tokens[i:j])])
                    if code != 0:
                        raise RuntimeError(f"embedding decode failed with code {code}")
                    if not self.pooled:
                        text_vectors += self._vectors(0, j - i)
                    pos += j - i
                else:
                    rows: list[tuple[np.ndarray, int, int]] = []
                    sections: list[np.ndarray] = []
                    non_causal = False
                    for tok in tokens[i:j]:
                        found = self.media.entry(tok)
                        if found is None:
                            raise EmbedError("an image or audio of this input is no longer in the media store")
                        entry, k = found
                        if k == 0:
                            base, end = pos, pos + (entry.n_pos or len(entry.embeddings))
                        rows.append((entry.embeddings[k], base + k, 0))
                        non_causal = non_causal or entry.non_causal
                        if self.mrope:
                            sections.append(entry.positions(k, base))
                        if k == len(entry.embeddings) - 1:
                            pos = end
                    code = ctx.decode_embd(
                        rows, non_causal=non_causal, sections=np.stack(sections) if sections else None
                    )
                    if code != 0:
                        raise RuntimeError(f"embedding decode failed with code {code} (media)")
                self.decodes += 1
                i = j
            if self.pooled:
                width = self.n_cls_out if self.pooling == C.LLAMA_POOLING_TYPE_RANK else self.n_embd
                ptr = C.llama_get_embeddings_seq(ctx.handle, 0)
                return np.array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float * width)).contents, dtype=np.float32)
            return np.stack(text_vectors).astype(np.float32)
        finally:
            ctx.clear()

    def embed(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """One vector per input (pooled), or one matrix of token vectors (pooling none)."""
        for tokens in inputs:
            self.check(tokens)
        results: list[np.ndarray] = []
        group: list[list[int]] = []
        used = 0
        limit_tokens = min(self.context.n_batch, self.n_ubatch)
        limit_seqs = self.context.settings.n_seq_max
        for tokens in inputs:
            if any(tok < 0 for tok in tokens):
                if group:
                    results += self._run(group)
                    group, used = [], 0
                results.append(self._run_media(tokens))
                continue
            if group and (used + len(tokens) > limit_tokens or len(group) >= limit_seqs):
                results += self._run(group)
                group, used = [], 0
            group.append(tokens)
            used += len(tokens)
        if group:
            results += self._run(group)
        return results
