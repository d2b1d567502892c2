"""A loaded GGUF model and its vocabulary, wrapped over llama.cpp's ctypes API.

Everything here is read-only after loading, so the HTTP side may tokenize and
detokenize from any thread while the scheduler thread decodes.
"""

from __future__ import annotations

import ctypes
import threading

import llama_cpp
import llama_cpp.llama_cpp as C

from llamaserve.engine.backend import ModelInfo
from llamaserve.llama import load_params
from llamaserve.llama.grammar import check_grammar
from llamaserve.llama.load_params import ModelLoadSettings
from llamaserve.llama.progress import apply_load_progress

LLAMA_CPP_VERSION: str = llama_cpp.__version__

_backend_lock = threading.Lock()
_backend_ready = False


def ensure_backend() -> None:
    """Initialise llama.cpp's backends once per process."""
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            C.llama_backend_init()
            _backend_ready = True


NUMA_STRATEGIES = {"distribute": 1, "isolate": 2, "numactl": 3}  # ggml_numa_strategy


def init_numa(strategy: str) -> None:
    """--numa: llama.cpp's NUMA placement, set once after the backends and before any model loads."""
    ensure_backend()
    C.llama_numa_init(NUMA_STRATEGIES[strategy])


def gpu_offload_supported() -> bool:
    ensure_backend()
    return bool(C.llama_supports_gpu_offload())


class ModelLoadError(RuntimeError):
    """The GGUF file could not be loaded."""


class Model:
    """A llama.cpp model plus vocabulary helpers (tokenize, pieces, specials)."""

    def __init__(self, path: str, settings: ModelLoadSettings | None = None, *, vocab_only: bool = False) -> None:
        ensure_backend()
        params, keep_alive = load_params.build(settings or ModelLoadSettings(), vocab_only=vocab_only)
        apply_load_progress(params)  # the terminal's loading bar and abort-on-shutdown, when set
        handle = C.llama_model_load_from_file(path.encode(), params)
        del keep_alive  # llama.cpp has copied what it needs from the arrays by now
        if not handle:
            raise ModelLoadError(f"failed to load model from '{path}'")
        self.handle = handle
        self.path = path
        self.vocab = C.llama_model_get_vocab(handle)
        self.n_vocab: int = C.llama_vocab_n_tokens(self.vocab)
        self.bos: int = C.llama_vocab_bos(self.vocab)
        self.eos: int = C.llama_vocab_eos(self.vocab)
        self.sep: int = C.llama_vocab_sep(self.vocab)
        self.n_ctx_train: int = int(C.llama_model_n_ctx_train(handle))
        self.n_layer: int = int(C.llama_model_n_layer(handle))
        # Pieces are cached because detokenizing is on the hot path of every
        # generated token and the vocabulary never changes.
        self._piece_cache: dict[int, bytes] = {}
        self._special_piece_cache: dict[int, bytes] = {}
        # Asked of every generated token: a dict lookup instead of a ctypes call after the first.
        self._is_eog_cache: dict[int, bool] = {}
        self._eog_tokens: list[int] | None = None

    # ----------------------------------------------------------------- facts
    def info(self) -> ModelInfo:
        buf = ctypes.create_string_buffer(256)
        C.llama_model_desc(self.handle, buf, len(buf))
        ftype = C.llama_ftype_name(C.llama_model_ftype(self.handle))
        return ModelInfo(
            path=self.path,
            description=buf.value.decode(errors="replace"),
            ftype=(ftype.decode() if isinstance(ftype, bytes) else str(ftype)),
            n_params=int(C.llama_model_n_params(self.handle)),
            size_bytes=int(C.llama_model_size(self.handle)),
            n_ctx_train=int(C.llama_model_n_ctx_train(self.handle)),
            n_embd=int(C.llama_model_n_embd(self.handle)),
            n_vocab=self.n_vocab,
            vocab_type=int(C.llama_vocab_type(self.vocab)),
            has_encoder=bool(C.llama_model_has_encoder(self.handle)),
            has_decoder=bool(C.llama_model_has_decoder(self.handle)),
        )

    def chat_template(self, name: str | None = None) -> str | None:
        raw = C.llama_model_chat_template(self.handle, name.encode() if name else None)
        return raw.decode(errors="replace") if raw else None

    def token_text(self, token: int) -> str:
        raw = C.llama_vocab_get_text(self.vocab, token)
        return raw.decode(errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        known = self._is_eog_cache.get(token)
        if known is None:
            known = self._is_eog_cache[token] = bool(C.llama_vocab_is_eog(self.vocab, token))
        return known

    def eog_tokens(self) -> list[int]:
        """All end-of-generation token ids (computed once: it scans the vocabulary)."""
        if self._eog_tokens is None:
            self._eog_tokens = [t for t in range(self.n_vocab) if C.llama_vocab_is_eog(self.vocab, t)]
        return self._eog_tokens

    def fim_tokens(self) -> dict[str, int]:
        """Fill-in-the-middle token ids found by llama.cpp (-1 when absent)."""
        return {
            "pre": C.llama_vocab_fim_pre(self.vocab),
            "suf": C.llama_vocab_fim_suf(self.vocab),
            "mid": C.llama_vocab_fim_mid(self.vocab),
            "pad": C.llama_vocab_fim_pad(self.vocab),
            "rep": C.llama_vocab_fim_rep(self.vocab),
            "sep": C.llama_vocab_fim_sep(self.vocab),
        }

    # ------------------------------------------------------------ tokenizing
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8", errors="replace")
        capacity = len(data) + 8
        buf = (C.llama_token * capacity)()
        n = C.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (C.llama_token * capacity)()
            n = C.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
            if n < 0:
                raise ValueError("tokenization failed")
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The raw bytes of one token (may be a partial UTF-8 sequence)."""
        if token < 0:
            return b""  # a media placeholder (engine/backend.py): no text of its own
        cache = self._special_piece_cache if special else self._piece_cache
        cached = cache.get(token)
        if cached is not None:
            return cached
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        out = buf.raw[:n]
        cache[token] = out
        return out

    def detokenize(self, tokens: list[int], *, special: bool = False) -> str:
        return b"".join(self.piece(t, special=special) for t in tokens).decode("utf-8", errors="replace")

    def valid_token(self, token: int) -> bool:
        return 0 <= token < self.n_vocab

    def check_grammar(self, grammar: str, triggers: tuple[str, ...] = ()) -> None:
        """Parse a grammar with llama.cpp once, so a bad one is a 400 before it reaches a slot."""
        check_grammar(self.vocab, grammar, triggers)

    def close(self) -> None:
        if self.handle:
            C.llama_model_free(self.handle)
            self.handle = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass
