"""Log-probabilities of a decoded row, from llama.cpp's raw logits.

These are the model's distribution before sampling (llama-server's default,
`post_sampling_probs: false`): softmax over the full vocabulary.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from llamaserve.engine.types import TokenLogprob
from llamaserve.llama.logits import logits_row


def _log_softmax(logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    shifted = logits.astype(np.float64) - float(np.max(logits))
    out: npt.NDArray[np.float64] = shifted - np.log(np.sum(np.exp(shifted)))
    return out


def token_logprob(ctx: object, index: int, n_vocab: int, chosen: int, k: int) -> TokenLogprob:
    """The chosen token's log-probability and the k most likely tokens at batch row ``index``."""
    lp = _log_softmax(logits_row(ctx, index, n_vocab))
    top: tuple[tuple[int, float], ...] = ()
    if k > 0:
        k = min(k, n_vocab)
        idx = np.argpartition(-lp, k - 1)[:k]
        idx = idx[np.argsort(-lp[idx], kind="stable")]
        top = tuple((int(t), float(lp[t])) for t in idx)
    return TokenLogprob(chosen, float(lp[chosen]), top)
