"""Write a small random LoRA adapter GGUF for a base model, for tests.

The file follows what llama.cpp's `llama_adapter_lora_init` (src/llama-adapter.cpp)
checks, and what `convert_lora_to_gguf.py` writes:

* metadata: `general.architecture` equal to the base model's, `general.type` =
  "adapter", `adapter.type` = "lora", `adapter.lora.alpha` (float32);
* tensors, in pairs, for each targeted base weight `blk.{i}.<target>.weight`:
  `blk.{i}.<target>.weight.lora_a` with ggml shape [n_in, rank] and
  `blk.{i}.<target>.weight.lora_b` with ggml shape [rank, n_out], where the base
  weight has ggml shape [n_in, n_out]. numpy shapes are the reverse:
  lora_a is (rank, n_in) and lora_b is (n_out, rank).

llama.cpp adds `scale * (B @ (A @ x))` to every targeted matmul, with
`scale = adapter_scale * alpha / rank` (or just `adapter_scale` when alpha is 0
or absent), and drops adapters whose scale is exactly 0 before building the
graph, so at scale 0 the output is bit-identical to the base model's.

Only the `gguf` package, numpy and the standard library are used; nothing is
dequantized, the base file's header (architecture, tensor shapes) is enough.
"""

from __future__ import annotations

import mmap
import os
import struct

import gguf
import numpy as np

DEFAULT_TARGETS: tuple[str, ...] = (
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
)


# Byte sizes of GGUF scalar metadata types (gguf.GGUFValueType values).
_SCALAR_SIZES: dict[int, int] = {
    gguf.GGUFValueType.UINT8: 1,
    gguf.GGUFValueType.INT8: 1,
    gguf.GGUFValueType.UINT16: 2,
    gguf.GGUFValueType.INT16: 2,
    gguf.GGUFValueType.UINT32: 4,
    gguf.GGUFValueType.INT32: 4,
    gguf.GGUFValueType.FLOAT32: 4,
    gguf.GGUFValueType.BOOL: 1,
    gguf.GGUFValueType.UINT64: 8,
    gguf.GGUFValueType.INT64: 8,
    gguf.GGUFValueType.FLOAT64: 8,
}


def read_base_header(model_path: str) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The base model's architecture and the ggml shape (ne0, ne1, ...) of each tensor.

    A direct scan of the GGUF header: gguf.GGUFReader builds a numpy view for
    every vocabulary string and takes ~3 s on SmolLM2's 49k-token vocabulary,
    while this skips values it does not need and takes a few milliseconds.
    """
    with open(model_path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as head:
        return _scan_header(model_path, head)


def _scan_header(model_path: str, head: mmap.mmap) -> tuple[str, dict[str, tuple[int, ...]]]:
    if head[:4] != b"GGUF":
        raise ValueError(f"{model_path} is not a GGUF file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", head, 4)
    if version not in (2, 3):
        raise ValueError(f"unsupported GGUF version {version} (big-endian file?)")
    pos = 24

    def u32() -> int:
        nonlocal pos
        (v,) = struct.unpack_from("<I", head, pos)
        pos += 4
        return int(v)

    def u64() -> int:
        nonlocal pos
        (v,) = struct.unpack_from("<Q", head, pos)
        pos += 8
        return int(v)

    def string() -> str:
        nonlocal pos
        n = u64()
        pos += n
        return head[pos - n : pos].decode("utf-8", errors="replace")

    def skip_value(vtype: int) -> None:
        nonlocal pos
        if vtype == gguf.GGUFValueType.STRING:
            n = u64()  # not `pos += u64()`: that would add to pos as it was before the read
            pos += n
        elif vtype == gguf.GGUFValueType.ARRAY:
            etype, count = u32(), u64()
            if etype in _SCALAR_SIZES:
                size = _SCALAR_SIZES[etype] * count
                pos += size
            else:
                for _ in range(count):
                    skip_value(etype)
        else:
            pos += _SCALAR_SIZES[vtype]

    arch: str | None = None
    for _ in range(n_kv):
        key = string()
        vtype = u32()
        if key == "general.architecture" and vtype == gguf.GGUFValueType.STRING:
            arch = string()
        else:
            skip_value(vtype)
    if arch is None:
        raise ValueError(f"{model_path} has no general.architecture")
    shapes: dict[str, tuple[int, ...]] = {}
    for _ in range(n_tensors):
        name = string()
        n_dims = u32()
        shapes[name] = tuple(u64() for _ in range(n_dims))
        pos += 4 + 8  # ggml type, data offset
    return arch, shapes


def write_random_lora(
    model_path: str,
    out_path: str,
    *,
    rank: int = 8,
    scale_init: float = 0.5,
    seed: int = 0,
    alpha: float | None = None,
    targets: tuple[str, ...] = DEFAULT_TARGETS,
) -> None:
    """Write a LoRA adapter for the base GGUF at `model_path` to `out_path`.

    For each base weight `blk.{i}.<target>.weight` (ggml shape [n_in, n_out]),
    A has entries N(0, 1/n_in) and B entries N(0, scale_init**2 / rank), both
    float32, so each output of the low-rank update B @ A @ x has an RMS of
    about `scale_init * rms(x)` whatever the rank. With the default 0.5 and
    adapter scale 1, the embedded SmolLM2-135M's greedy output visibly changes
    while staying finite (max logit change ~10 on a short prompt); 1.0 starts to
    produce word salad. The default targets at rank 8 make a ~9.8 MB file.

    `alpha` is stored as `adapter.lora.alpha`; None stores `rank`, so the
    effective multiplier llama.cpp applies is exactly the adapter scale.
    Targets missing from some blocks are skipped there; a target found in no
    block at all is an error.
    """
    if rank < 1:
        raise ValueError("rank must be >= 1")
    if not targets:
        raise ValueError("targets must not be empty")
    # ggml shape of each base tensor: (ne0, ne1) = (n_in, n_out) for a matmul weight.
    arch, shapes = read_base_header(model_path)
    n_layer = 1 + max((int(name.split(".")[1]) for name in shapes if name.startswith("blk.")), default=-1)

    rng = np.random.default_rng(seed)
    pairs: list[tuple[str, np.ndarray, np.ndarray]] = []
    found: set[str] = set()
    for il in range(n_layer):
        for target in targets:
            name = f"blk.{il}.{target}.weight"
            shape = shapes.get(name)
            if shape is None:
                continue
            if len(shape) != 2:
                raise ValueError(f"{name} has ggml shape {shape}, not a 2-D matmul weight")
            n_in, n_out = shape
            a = rng.standard_normal((rank, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))
            b = rng.standard_normal((n_out, rank), dtype=np.float32) * np.float32(scale_init / np.sqrt(rank))
            pairs.append((name, a, b))
            found.add(target)
    missing = [t for t in targets if t not in found]
    if missing:
        raise ValueError(f"targets not in the base model's blocks: {missing}")

    writer = gguf.GGUFWriter(os.fspath(out_path), arch)  # writes general.architecture
    try:
        writer.add_type(gguf.GGUFType.ADAPTER)  # general.type = "adapter"
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank) if alpha is None else float(alpha))
        for name, a, b in pairs:
            writer.add_tensor(f"{name}.lora_a", a)
            writer.add_tensor(f"{name}.lora_b", b)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
