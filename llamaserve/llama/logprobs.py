"""Log-probabilities of a decoded row, from llama.cpp's raw logits.

These are the model's distribution before sampling (llama-server's default,
`post_sampling_probs: false`): softmax over the full vocabulary.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp.llama_cpp as C
import numpy as np


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


def _row(ctx: object, index: int, n_vocab: int) -> np.ndarray:
    ptr = C.llama_get_logits_ith(ctx, index)
    buf = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float * n_vocab)).contents
    return np.frombuffer(buf, dtype=np.float32, count=n_vocab)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    return shifted - np.log(np.sum(np.exp(shifted)))


def token_logprob(ctx: object, index: int, n_vocab: int, chosen: int, k: int) -> TokenLogprob:
    """The chosen token's log-probability and the k most likely tokens at batch row ``index``."""
    lp = _log_softmax(_row(ctx, index, n_vocab))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        k = min(k, n_vocab)
        idx = np.argpartition(-lp, k - 1)[:k]
        idx = idx[np.argsort(-lp[idx], kind="stable")]
        top = tuple((int(t), float(lp[t])) for t in idx)
    return TokenLogprob(chosen, float(lp[chosen]), top)
