"""A decoded row's raw logits as a numpy view over llama.cpp's own buffer.

Every sampled token reads one row, right after a decode has evicted the CPU
caches, and there building the view the usual way (`ctypes.cast` to a float
pointer, then `np.ctypeslib.as_array`, which makes a ctypes array type) cost
55-60 µs a token on SmolLM2, more than the greedy pick itself. llama.cpp keeps
the logits in one buffer that moves only when it grows, so the same rows come
back at the same addresses: a view made once per address is reused.
"""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as C
import numpy as np
import numpy.typing as npt

# llama_get_logits_ith returning a plain address (an int) instead of a ctypes float pointer,
# so that the cache below can be keyed on it without another ctypes call. It keeps the GIL
# (PYFUNCTYPE): the call only looks the row up, and releasing the GIL there would let a
# waiting thread (the event loop) take it in the middle of sampling.
_GET_LOGITS_ITH_ADDRESS = ctypes.cast(C._lib.llama_get_logits_ith, ctypes.c_void_p).value
assert _GET_LOGITS_ITH_ADDRESS is not None
_get_logits_ith = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)(_GET_LOGITS_ITH_ADDRESS)

# (address, n_vocab) -> view. A view is handed out only while llama.cpp returns its address,
# i.e. while that memory is the live buffer; views of a buffer that moved are simply never
# matched again, and the cap keeps them from piling up.
_views: dict[tuple[int, int], npt.NDArray[np.float32]] = {}
_MAX_VIEWS = 1024


def logits_row(ctx: object, index: int, n_vocab: int) -> npt.NDArray[np.float32]:
    """The logits at batch row ``index`` (-1: the last one) of the context's last decode.

    The view is llama.cpp's memory: valid until the next decode, and writes go to it.
    """
    address = _get_logits_ith(ctx, index)
    if not address:
        raise ValueError(f"no logits at batch row {index}: the row was decoded without them")
    key = (address, n_vocab)
    view = _views.get(key)
    if view is None:
        if len(_views) >= _MAX_VIEWS:
            _views.clear()
        view = _views[key] = np.frombuffer(
            memoryview((ctypes.c_float * n_vocab).from_address(address)), dtype=np.float32
        )
    return view
