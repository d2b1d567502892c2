"""Embeddings and rerank scores from a context created with embeddings on.

Runs on the scheduler thread (through a `Call`), which owns the context.
Many inputs are packed into one decode, one sequence id each, within the
batch size and the number of sequences the context was made for.
"""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as C
import numpy as np

from llamaserve.engine.backend import EmbedError
from llamaserve.llama.context import Context


class Embedder:
    def __init__(self, context: Context) -> None:
        self.context = context
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
            if group and (used + len(tokens) > limit_tokens or len(group) >= limit_seqs):
                results += self._run(group)
                group, used = [], 0
            group.append(tokens)
            used += len(tokens)
        if group:
            results += self._run(group)
        return results
