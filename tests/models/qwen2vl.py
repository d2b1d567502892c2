"""A tiny Qwen2-VL-shaped pair with random weights: a ``qwen2vl`` text model (M-RoPE, four
rope sections) and a ``qwen2vl_merger`` projector that feeds it.

No Qwen-VL model is available offline. These two exercise what sets the family apart in
llama.cpp: an image's embeddings placed at (time, row, column) positions, the text after
it advancing by ``max(grid width, grid height)`` positions instead of its token count. The
text model borrows SmolLM2-135M's tokenizer and chat template (copied from its GGUF), so
prompts tokenize as they do there; its answers mean nothing.

Tensor names and keys follow src/models/qwen2vl.cpp and tools/mtmd/clip.cpp (qwen2vl_merger)
of the llama.cpp that llama-cpp-python 0.3.36 ships. Shapes are numpy's (row-major), the
reverse of ggml's ``ne``.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from tests.models.mmproj import _layer, _writer

TEXT_EMBD = 64
N_HEAD, N_HEAD_KV, N_FF, N_LAYER = 4, 2, 128, 2
ROPE_SECTIONS = [2, 3, 3, 0]  # sums to head_dim / 2 (16 / 2), as Qwen2-VL's [16, 24, 24, 0] does for 128
PATCH = 8  # the projector's patch size; 2 x 2 patches merge into one token


def _copy_tokenizer(w: gguf.GGUFWriter, source: str) -> None:
    reader = gguf.GGUFReader(source)
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, field.contents(), kind, sub_type=field.types[-1])
        else:
            w.add_key_value(name, field.contents(), kind)


def text_model(path: Path, tokenizer_from: str, seed: int = 3) -> Path:
    """A 2-layer ``qwen2vl`` model, 64 wide, with the tokenizer of ``tokenizer_from``."""
    n_vocab = len(gguf.GGUFReader(tokenizer_from).fields["tokenizer.ggml.tokens"].data)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "qwen2vl")
    w.add_string("general.name", "mechanics-test qwen2vl")
    w.add_uint32("general.file_type", 0)
    w.add_context_length(4096)
    w.add_embedding_length(TEXT_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1e6)
    w.add_array("qwen2vl.rope.dimension_sections", ROPE_SECTIONS)
    _copy_tokenizer(w, tokenizer_from)
    head = TEXT_EMBD // N_HEAD

    def t(name: str, *shape: int, scale: float = 0.2) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    t("token_embd.weight", n_vocab, TEXT_EMBD, scale=1.0)
    w.add_tensor("output_norm.weight", np.ones(TEXT_EMBD, dtype=np.float32))
    for il in range(N_LAYER):
        w.add_tensor(f"blk.{il}.attn_norm.weight", np.ones(TEXT_EMBD, dtype=np.float32))
        t(f"blk.{il}.attn_q.weight", TEXT_EMBD, TEXT_EMBD)
        t(f"blk.{il}.attn_q.bias", TEXT_EMBD)
        t(f"blk.{il}.attn_k.weight", N_HEAD_KV * head, TEXT_EMBD)
        t(f"blk.{il}.attn_k.bias", N_HEAD_KV * head)
        t(f"blk.{il}.attn_v.weight", N_HEAD_KV * head, TEXT_EMBD)
        t(f"blk.{il}.attn_v.bias", N_HEAD_KV * head)
        t(f"blk.{il}.attn_output.weight", TEXT_EMBD, TEXT_EMBD)
        w.add_tensor(f"blk.{il}.ffn_norm.weight", np.ones(TEXT_EMBD, dtype=np.float32))
        t(f"blk.{il}.ffn_gate.weight", N_FF, TEXT_EMBD)
        t(f"blk.{il}.ffn_up.weight", N_FF, TEXT_EMBD)
        t(f"blk.{il}.ffn_down.weight", TEXT_EMBD, N_FF)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def projector(path: Path, seed: int = 4) -> Path:
    """A ``qwen2vl_merger`` projector into TEXT_EMBD: a one-layer ViT over 8-pixel patches
    (two patch kernels, for the two frames of a video pair), each 2 x 2 patches merged into one
    token; an image of W x H pixels (as mtmd resizes it) is a (W/16) x (H/16) grid of tokens."""
    n_embd, n_ff, n_head = 64, 128, 4
    rng = np.random.default_rng(seed)
    w = _writer(path, "mechanics-test qwen2vl projector")
    w.add_string("clip.projector_type", "qwen2vl_merger")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.embedding_length", n_embd)
    w.add_uint32("clip.vision.feed_forward_length", n_ff)
    w.add_uint32("clip.vision.block_count", 1)
    w.add_uint32("clip.vision.projection_dim", TEXT_EMBD)
    w.add_uint32("clip.vision.attention.head_count", n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.image_size", 64)
    w.add_uint32("clip.vision.patch_size", PATCH)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    t("v.patch_embd.weight", n_embd, 3, PATCH, PATCH)
    t("v.patch_embd.weight.1", n_embd, 3, PATCH, PATCH)
    _layer(w, rng, "v", n_embd, n_ff, k_bias=True)
    w.add_tensor("v.post_ln.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("v.post_ln.bias", np.zeros(n_embd, dtype=np.float32))
    # the merger: 4 patches (4 x n_embd) → hidden → the text width
    t("mm.0.weight", 4 * n_embd, 4 * n_embd)
    t("mm.0.bias", 4 * n_embd)
    t("mm.2.weight", TEXT_EMBD, 4 * n_embd)
    t("mm.2.bias", TEXT_EMBD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
