"""A llama.cpp context: the KV cache, one reusable batch, decode and memory ops.

Only the scheduler thread touches a Context after creation.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp.llama_cpp as C
import numpy as np

from llamaserve.llama.model import Model

POOLING_TYPES: dict[str, int] = {
    "unspecified": C.LLAMA_POOLING_TYPE_UNSPECIFIED,
    "none": C.LLAMA_POOLING_TYPE_NONE,
    "mean": C.LLAMA_POOLING_TYPE_MEAN,
    "cls": C.LLAMA_POOLING_TYPE_CLS,
    "last": C.LLAMA_POOLING_TYPE_LAST,
    "rank": C.LLAMA_POOLING_TYPE_RANK,
}

FLASH_ATTN_TYPES: dict[str, int] = {
    "auto": C.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": C.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": C.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


# -ctk/-ctv names → ggml_type (the types llama-server allows for the KV cache)
KV_CACHE_TYPES: dict[str, int] = {
    "f32": C.GGML_TYPE_F32,
    "f16": C.GGML_TYPE_F16,
    "bf16": 30,  # GGML_TYPE_BF16 (llama-cpp-python has no constant for it)
    "q8_0": C.GGML_TYPE_Q8_0,
    "q4_0": C.GGML_TYPE_Q4_0,
    "q4_1": C.GGML_TYPE_Q4_1,
    "iq4_nl": C.GGML_TYPE_IQ4_NL,
    "q5_0": C.GGML_TYPE_Q5_0,
    "q5_1": C.GGML_TYPE_Q5_1,
}

ROPE_SCALING_TYPES: dict[str, int] = {
    "none": C.LLAMA_ROPE_SCALING_TYPE_NONE,
    "linear": C.LLAMA_ROPE_SCALING_TYPE_LINEAR,
    "yarn": C.LLAMA_ROPE_SCALING_TYPE_YARN,
}


# ggml's CPU flash attention (ggml-cpu/ops.cpp) takes a micro-batch of GGML_FA_TILE_Q query rows
# or more as tiled matrix products, and a smaller one row by row; only over f16 or f32 KV.
CPU_FA_TILE_ROWS = 64


def cpu_flash_attention_tile(settings: ContextSettings, offloads: bool) -> int:
    """The query rows of a flash-attention tile where attention runs on ggml's CPU kernel, else 0.

    `LlamaRunner` keeps decode rows and prompt chunks apart for it (llama/runner.
    split_decode_rows) and engine/kv/reuse.pad_prefill tops short prompts up to it. With
    "auto", llama.cpp turns flash attention on where the backend has it, as the CPU's has.
    """
    kv_types = {settings.cache_type_k, settings.cache_type_v}
    if settings.flash_attn == "off" or offloads or len(kv_types) != 1 or not kv_types <= {"f16", "f32"}:
        return 0
    return CPU_FA_TILE_ROWS


class ContextError(RuntimeError):
    """The context could not be created or a decode failed hard."""


@dataclass(frozen=True)
class ContextSettings:
    n_ctx: int
    n_batch: int
    n_ubatch: int
    n_seq_max: int
    n_threads: int
    n_threads_batch: int
    kv_unified: bool
    embeddings: bool = False
    pooling: str = "unspecified"
    flash_attn: str = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    rope_scaling: str | None = None  # None: the model's
    rope_freq_base: float = 0.0  # 0: the model's
    rope_freq_scale: float = 0.0
    yarn_orig_ctx: int = 0
    yarn_ext_factor: float = -1.0
    yarn_attn_factor: float = -1.0
    yarn_beta_slow: float = -1.0
    yarn_beta_fast: float = -1.0
    defrag_thold: float = -1.0
    offload_kqv: bool = True
    op_offload: bool = True
    swa_full: bool = False
    perf: bool = False


def prefix_sharing_note(model: object, kv_unified: bool) -> str:
    """Why sequences of this context cannot share KV cells by seq_cp ("" when they can).

    Within one unified KV stream llama_memory_seq_cp over a position range only tags cells.
    Split KV copies whole streams; a recurrent state is one cell per sequence, not a cell per
    position; a sliding-window cache drops a cell once the newest token of any sequence
    holding it has moved past the window, which another sharer may still need.
    """
    if not kv_unified:
        return "the KV cache is split per sequence (--no-kv-unified)"
    if C.llama_model_is_recurrent(model) or C.llama_model_is_hybrid(model):
        return "the model keeps a recurrent state"
    if int(C.llama_model_n_swa(model)) > 0:
        return "the model uses sliding-window attention"
    return ""


class Context:
    """Owns a llama_context and a batch sized to n_batch."""

    def __init__(self, model: Model, settings: ContextSettings) -> None:
        params = C.llama_context_default_params()
        params.n_ctx = settings.n_ctx
        params.n_batch = settings.n_batch
        params.n_ubatch = min(settings.n_ubatch, settings.n_batch)
        params.n_seq_max = settings.n_seq_max
        params.n_threads = settings.n_threads
        params.n_threads_batch = settings.n_threads_batch
        params.kv_unified = settings.kv_unified
        params.embeddings = settings.embeddings
        params.pooling_type = POOLING_TYPES[settings.pooling]
        params.flash_attn_type = FLASH_ATTN_TYPES[settings.flash_attn]
        params.type_k = KV_CACHE_TYPES[settings.cache_type_k]
        params.type_v = KV_CACHE_TYPES[settings.cache_type_v]
        if settings.rope_scaling is not None:
            params.rope_scaling_type = ROPE_SCALING_TYPES[settings.rope_scaling]
        params.rope_freq_base = settings.rope_freq_base
        params.rope_freq_scale = settings.rope_freq_scale
        params.yarn_orig_ctx = settings.yarn_orig_ctx
        params.yarn_ext_factor = settings.yarn_ext_factor
        params.yarn_attn_factor = settings.yarn_attn_factor
        params.yarn_beta_slow = settings.yarn_beta_slow
        params.yarn_beta_fast = settings.yarn_beta_fast
        params.defrag_thold = settings.defrag_thold
        params.offload_kqv = settings.offload_kqv
        params.op_offload = settings.op_offload
        params.swa_full = settings.swa_full
        params.no_perf = not settings.perf
        handle = C.llama_init_from_model(model.handle, params)
        if not handle:
            raise ContextError("failed to create the llama context (is -c too large for memory?)")
        self.handle = handle
        self.model = model
        self.settings = settings
        self.memory = C.llama_get_memory(handle)
        self.n_ctx: int = int(C.llama_n_ctx(handle))
        self.n_ctx_seq: int = int(C.llama_n_ctx_seq(handle))
        self.n_batch: int = int(C.llama_n_batch(handle))
        self.batch = C.llama_batch_init(self.n_batch, 0, 1)
        self.n_embd: int = int(C.llama_model_n_embd_inp(model.handle))
        self._embd_batch: C.llama_batch | None = None  # media embeddings, made on first use
        self.sharing_note = prefix_sharing_note(model.handle, settings.kv_unified)
        # Each batch row carries exactly one sequence id, written in place.
        for i in range(self.n_batch):
            self.batch.n_seq_id[i] = 1

    # ---------------------------------------------------------------- decode
    def decode(self, rows: list[tuple[int, int, int, bool]]) -> int:
        """Decode rows of (token, pos, seq_id, want_logits); returns llama_decode's code."""
        batch = self.batch
        token, pos, seq_id, logits = batch.token, batch.pos, batch.seq_id, batch.logits
        for i, (tok, p, seq, want) in enumerate(rows):
            token[i] = tok
            pos[i] = p
            seq_id[i][0] = seq
            logits[i] = 1 if want else 0
        batch.n_tokens = len(rows)
        return int(C.llama_decode(self.handle, batch))

    def decode_embd(
        self, rows: list[tuple[np.ndarray, int, int]], *, non_causal: bool, sections: np.ndarray | None = None
    ) -> int:
        """Decode rows of (embedding, pos, seq_id), no logits: media placed in the KV cache.

        ``non_causal``: the rows attend to each other both ways, as projectors such as
        gemma3's expect of an image's embeddings (llama.cpp's causal flag, restored after).
        ``sections``: M-RoPE models (Qwen2-VL family) place each embedding at four positions
        (time, row, column, extra), one (n_rows, 4) array; the pos of ``rows`` is then unused.
        """
        if self._embd_batch is None:
            self._embd_batch = C.llama_batch_init(self.n_batch, self.n_embd, 1)
            for i in range(self.n_batch):
                self._embd_batch.n_seq_id[i] = 1
        batch = self._embd_batch
        embd = np.ctypeslib.as_array(batch.embd, shape=(self.n_batch, self.n_embd))
        for i, (vec, p, seq) in enumerate(rows):
            embd[i] = vec
            batch.pos[i] = p
            batch.seq_id[i][0] = seq
            batch.logits[i] = 0
        n = len(rows)
        batch.n_tokens = n
        # The batch's own buffer, by address: a pointer field read from a ctypes struct is a view
        # of the field, which the assignment below would change too.
        own_pos = ctypes.cast(batch.pos, ctypes.c_void_p).value or 0
        if sections is not None:
            # llama.cpp reads an embeddings batch's positions section-major (pos[j*n + i]), four
            # per row, from the batch's pos pointer: a buffer of our own stands in for this call.
            flat = np.ascontiguousarray(sections[:n].T, dtype=np.int32).reshape(-1)  # alive until decoded
            batch.pos = flat.ctypes.data_as(ctypes.POINTER(C.llama_pos))
        if non_causal:
            C.llama_set_causal_attn(self.handle, False)
        try:
            return int(C.llama_decode(self.handle, batch))
        finally:
            batch.pos = ctypes.cast(own_pos, ctypes.POINTER(C.llama_pos))  # llama_batch_free frees it
            if non_causal:
                C.llama_set_causal_attn(self.handle, True)

    def warm_up(self, token: int, one_thread: bool = False) -> None:
        """One throwaway decode, as llama-server does at start: the first real
        request would otherwise pay for the compute buffers and cold weight pages.

        `one_thread`: at start the decode runs beside Python importing the server, and ggml's
        threads meet at every op, so a second one sharing a core with the imports slows the
        decode down (on 2 cores, ~0.1 s of start-up); one thread touches the same pages."""
        if one_thread:
            C.llama_set_n_threads(self.handle, 1, 1)
        try:
            self.decode([(token, 0, 0, True)])
        finally:
            if one_thread:
                C.llama_set_n_threads(self.handle, self.settings.n_threads, self.settings.n_threads_batch)
        self.clear()

    def seq_remove(self, seq_id: int, p0: int, p1: int = -1) -> bool:
        return bool(C.llama_memory_seq_rm(self.memory, seq_id, p0, p1))

    def seq_copy(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        C.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_shift(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Move the positions of cells in [p0, p1) by delta (RoPE is re-applied lazily)."""
        C.llama_memory_seq_add(self.memory, seq_id, p0, p1, delta)

    @property
    def can_shift(self) -> bool:
        return bool(C.llama_memory_can_shift(self.memory))

    def clear(self) -> None:
        C.llama_memory_clear(self.memory, True)

    # ---------------------------------------------------------------- state
    def seq_state(self, seq_id: int) -> bytearray:
        """The KV cells of one sequence, serialised (for the host-memory prompt cache).

        llama.cpp writes straight into the returned buffer: a state is about 23 KB per token of
        SmolLM2, so a staging copy (zeroed, then copied again into bytes) cost as much as the
        copy itself (5,400 tokens: about 175 against 80 ms).
        """
        size = int(C.llama_state_seq_get_size(self.handle, seq_id))
        state = bytearray(size)
        written = int(C.llama_state_seq_get_data(self.handle, (ctypes.c_uint8 * size).from_buffer(state), size, seq_id))
        del state[written:]
        return state

    def set_seq_state(self, seq_id: int, data: bytes | bytearray) -> bool:
        """Load what seq_state returned into seq_id (which should be empty), without copying it first."""
        # A bytearray is shared as it is; immutable bytes through a pointer to their buffer.
        source = (
            (ctypes.c_uint8 * len(data)).from_buffer(data)
            if isinstance(data, bytearray)
            else ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))
        )
        return int(C.llama_state_seq_set_data(self.handle, source, len(data), seq_id)) > 0

    def save_seq_file(self, path: str, seq_id: int, tokens: list[int]) -> int:
        """Write a sequence's KV cells and its tokens; returns bytes written (0 on failure)."""
        arr = (C.llama_token * len(tokens))(*tokens)
        return int(C.llama_state_seq_save_file(self.handle, path.encode(), seq_id, arr, len(tokens)))

    def load_seq_file(self, path: str, seq_id: int, capacity: int) -> tuple[int, list[int]]:
        """Read a file written by save_seq_file into seq_id; returns (bytes read, tokens).

        Bytes read is 0 when the file does not fit this context or model.
        """
        arr = (C.llama_token * capacity)()
        count = ctypes.c_size_t(0)
        n_read = int(
            C.llama_state_seq_load_file(self.handle, path.encode(), seq_id, arr, capacity, ctypes.byref(count))
        )
        return n_read, list(arr[: count.value]) if n_read else []

    def close(self) -> None:
        if self.handle:
            if self.settings.perf:  # --perf: llama.cpp's own timings, printed through its log as llama-server does
                C.llama_perf_context_print(self.handle)
            C.llama_batch_free(self.batch)
            if self._embd_batch is not None:
                C.llama_batch_free(self._embd_batch)
            C.llama_free(self.handle)
            self.handle = None
