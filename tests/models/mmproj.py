"""Tiny multimodal projectors with random weights, in mtmd's GGUF format.

No real vision or audio model is available offline, so the multimodal tests load
one of these beside SmolLM2-135M: their output embeddings have the text model's
width (576) and mtmd accepts them, but the weights are seeded noise. They exercise
the mechanics (chunking, token counts, KV placement, caching), never the meaning:
what the model "sees" in an image is arbitrary.

* :func:`vision_projector` writes a ``gemma3`` projector: a one-layer SigLIP-style
  ViT (conv patch embedding, learned positions, pre-norm attention and GELU MLP),
  average pooling by ``clip.vision.projector.scale_factor``, then RMS norm and a
  linear map into the text width. Every image is resized to ``image_size`` square,
  so it always becomes ``(image_size / patch_size / scale)^2`` tokens.
* :func:`audio_projector` writes a ``qwen2a`` projector: Whisper's two 1-D
  convolutions over 128 mel bins, a one-layer encoder (no key bias), average
  pooling by 2 and a linear map. mtmd cuts audio into 30 s windows of 3000 mel
  frames; each window becomes 750 tokens.
* :func:`omni_projector` writes both encoders into one file, with a projector type
  per modality (``clip.vision.projector_type``, ``clip.audio.projector_type``).

Tensor names, key names and shapes follow tools/mtmd/clip-impl.h and clip.cpp of
the llama.cpp that llama-cpp-python 0.3.36 ships. Shapes below are numpy's
(row-major), the reverse of ggml's ``ne``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

TEXT_EMBD = 576  # SmolLM2-135M's n_embd: mtmd refuses a projector of another width


def _writer(path: Path, name: str) -> gguf.GGUFWriter:
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", name)
    w.add_string("general.description", "random weights, for mechanics tests only")
    w.add_uint32("general.file_type", 0)  # all f32
    return w


def _encoder_keys(w: gguf.GGUFWriter, prefix: str, n_embd: int, n_ff: int, n_head: int, n_layer: int = 1) -> None:
    w.add_uint32(f"clip.{prefix}.embedding_length", n_embd)
    w.add_uint32(f"clip.{prefix}.feed_forward_length", n_ff)
    w.add_uint32(f"clip.{prefix}.block_count", n_layer)
    w.add_uint32(f"clip.{prefix}.projection_dim", TEXT_EMBD)
    w.add_uint32(f"clip.{prefix}.attention.head_count", n_head)
    w.add_float32(f"clip.{prefix}.attention.layer_norm_epsilon", 1e-6)


def _layer(
    w: gguf.GGUFWriter, rng: np.random.Generator, prefix: str, n_embd: int, n_ff: int, *, k_bias: bool, il: int = 0
) -> None:
    def t(name: str, *shape: int, scale: float = 0.05) -> None:
        w.add_tensor(f"{prefix}.blk.{il}.{name}", (rng.standard_normal(shape) * scale).astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(f"{prefix}.blk.{il}.{name}", np.ones(n, dtype=np.float32))

    for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
        t(f"{part}.weight", n_embd, n_embd)
        if part != "attn_k" or k_bias:
            t(f"{part}.bias", n_embd)
    ones("ln1.weight", n_embd)
    t("ln1.bias", n_embd)
    ones("ln2.weight", n_embd)
    t("ln2.bias", n_embd)
    # up: n_embd → n_ff, down: n_ff → n_embd (n_ff != n_embd, or clip.cpp takes them for swapped)
    t("ffn_up.weight", n_ff, n_embd)
    t("ffn_up.bias", n_ff)
    t("ffn_down.weight", n_embd, n_ff)
    t("ffn_down.bias", n_embd)


def _vision(
    w: gguf.GGUFWriter,
    rng: np.random.Generator,
    image_size: int,
    patch_size: int,
    scale: int,
    size: tuple[int, int, int, int] = (64, 128, 4, 1),
) -> None:
    n_embd, n_ff, n_head, n_layer = size
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    _encoder_keys(w, "vision", n_embd, n_ff, n_head, n_layer)
    w.add_uint32("clip.vision.image_size", image_size)
    w.add_uint32("clip.vision.patch_size", patch_size)
    w.add_uint32("clip.vision.projector.scale_factor", scale)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    n_patches = (image_size // patch_size) ** 2
    kernel = rng.standard_normal((n_embd, 3, patch_size, patch_size)) * 0.05
    w.add_tensor("v.patch_embd.weight", kernel.astype(np.float32))
    w.add_tensor("v.patch_embd.bias", np.zeros(n_embd, dtype=np.float32))
    w.add_tensor("v.position_embd.weight", (rng.standard_normal((n_patches, n_embd)) * 0.05).astype(np.float32))
    for il in range(n_layer):
        _layer(w, rng, "v", n_embd, n_ff, k_bias=True, il=il)
    w.add_tensor("v.post_ln.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("v.post_ln.bias", np.zeros(n_embd, dtype=np.float32))
    w.add_tensor("mm.soft_emb_norm.weight", np.ones(n_embd, dtype=np.float32))
    # ggml ne [TEXT_EMBD, n_embd]: the graph transposes it before the product
    w.add_tensor("mm.input_projection.weight", (rng.standard_normal((n_embd, TEXT_EMBD)) * 0.05).astype(np.float32))


def _audio(w: gguf.GGUFWriter, rng: np.random.Generator) -> None:
    n_embd, n_ff, n_head, n_mel = 64, 128, 4, 128
    n_pos = 1500  # 3000 mel frames after the stride-2 convolution
    w.add_bool("clip.has_audio_encoder", True)
    _encoder_keys(w, "audio", n_embd, n_ff, n_head)
    w.add_uint32("clip.audio.num_mel_bins", n_mel)

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    # conv1d kernels: ggml ne [kernel, in, out]; biases broadcast over frames: ne [1, out]
    t("a.conv1d.1.weight", n_embd, n_mel, 3)
    t("a.conv1d.1.bias", n_embd, 1)
    t("a.conv1d.2.weight", n_embd, n_embd, 3)
    t("a.conv1d.2.bias", n_embd, 1)
    t("a.position_embd.weight", n_pos, n_embd)
    _layer(w, rng, "a", n_embd, n_ff, k_bias=False)
    w.add_tensor("a.post_ln.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("a.post_ln.bias", np.zeros(n_embd, dtype=np.float32))
    t("mm.a.fc.weight", TEXT_EMBD, n_embd)
    t("mm.a.fc.bias", TEXT_EMBD)


def vision_projector(
    path: Path,
    *,
    image_size: int = 128,
    patch_size: int = 8,
    scale: int = 2,
    seed: int = 1,
    size: tuple[int, int, int, int] = (64, 128, 4, 1),
) -> Path:
    """A gemma3-type vision projector; each image becomes (image_size/patch_size/scale)^2 tokens.

    ``size`` is (n_embd, n_ff, n_head, n_layer) of the ViT: tiny for the tests; the benchmark
    uses SigLIP-base's (768, 3072, 12, 12) so that encoding costs what a real small one does.
    """
    w = _writer(path, "mechanics-test gemma3 vision projector")
    w.add_string("clip.projector_type", "gemma3")
    _vision(w, np.random.default_rng(seed), image_size, patch_size, scale, size)
    _finish(w)
    return path


def audio_projector(path: Path, *, seed: int = 2) -> Path:
    """A qwen2a-type (Qwen2-Audio) projector: 750 tokens per 30 s window."""
    w = _writer(path, "mechanics-test qwen2a audio projector")
    w.add_string("clip.projector_type", "qwen2a")
    _audio(w, np.random.default_rng(seed))
    _finish(w)
    return path


def omni_projector(path: Path, *, seed: int = 3) -> Path:
    """Both in one file, as mixed-modality projectors are written (a projector type per modality)."""
    rng = np.random.default_rng(seed)
    w = _writer(path, "mechanics-test gemma3 vision + qwen2a audio projector")
    w.add_string("clip.vision.projector_type", "gemma3")
    w.add_string("clip.audio.projector_type", "qwen2a")
    _vision(w, rng, 128, 8, 2)
    _audio(w, rng)
    _finish(w)
    return path


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for mmproj-{vision,audio,omni}.gguf")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(vision_projector(args.out / "mmproj-vision.gguf"))
    print(audio_projector(args.out / "mmproj-audio.gguf"))
    print(omni_projector(args.out / "mmproj-omni.gguf"))


if __name__ == "__main__":
    main()
