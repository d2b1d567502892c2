"""CPU thread pools for a context: affinity (-C/-Cr), strict placement, priority and polling.

llama-server attaches two ggml thread pools to its context (one for generation, one for prompt
batches) built from these flags, and sets the process priority from `--prio`. Without an attached
pool llama.cpp makes its own with default settings, so the pools are made only when a flag asks.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

from llamaserve.llama.devices import cpu_backend_reg, proc_address

log = logging.getLogger("llamaserve")

MAX_THREADS = 512  # GGML_MAX_N_THREADS
# --prio levels → nice values, as llama.cpp's set_process_priority uses on POSIX.
_NICE = {-1: 5, 0: 0, 1: -5, 2: -10, 3: -20}


class ThreadpoolParams(ctypes.Structure):
    _fields_ = [
        ("cpumask", ctypes.c_bool * MAX_THREADS),
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


@dataclass(frozen=True)
class PoolSpec:
    n_threads: int
    cpus: frozenset[int]
    strict: bool
    prio: int
    poll: int


def set_process_priority(prio: int) -> None:
    if prio == 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, 0, _NICE[prio])
    except OSError as exc:  # raising priority needs privileges; llama-server warns and goes on too
        log.warning("could not set the process priority to %d: %s", prio, exc)


class ThreadPools:
    """The two pools of one context, freed with it."""

    def __init__(self, context_handle: int, gen: PoolSpec, batch: PoolSpec) -> None:
        reg = cpu_backend_reg()
        new_addr, free_addr = proc_address(reg, "ggml_threadpool_new"), proc_address(reg, "ggml_threadpool_free")
        if not (new_addr and free_addr):
            raise RuntimeError("this llama.cpp build has no CPU thread pools")
        self._new = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(ThreadpoolParams))(new_addr)
        self._free = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(free_addr)
        self._pools: list[int] = []
        batch_pool = None
        if batch != gen:
            batch_pool = self._make(batch, paused=False)
        # With two pools the generation one starts paused, as llama-server does: llama.cpp
        # resumes whichever pool a decode uses.
        gen_pool = self._make(gen, paused=batch_pool is not None)
        _attach(context_handle, gen_pool, batch_pool or gen_pool)

    def _make(self, spec: PoolSpec, *, paused: bool) -> int:
        params = ThreadpoolParams()
        for cpu in spec.cpus:
            if cpu < MAX_THREADS:
                params.cpumask[cpu] = True
        params.n_threads = spec.n_threads
        params.prio = spec.prio
        params.poll = spec.poll
        params.strict_cpu = spec.strict
        params.paused = paused
        pool = self._new(ctypes.byref(params))
        if not pool:
            raise RuntimeError(f"could not create a thread pool of {spec.n_threads} threads")
        self._pools.append(int(pool))
        return int(pool)

    def close(self) -> None:
        for pool in self._pools:
            self._free(pool)
        self._pools = []


def _attach(context_handle: int, pool: int, batch_pool: int) -> None:
    import llama_cpp.llama_cpp as C

    fn = C._lib.llama_attach_threadpool
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    fn(context_handle, pool, batch_pool)


def detach(context_handle: int) -> None:
    import llama_cpp.llama_cpp as C

    fn = C._lib.llama_detach_threadpool
    fn.argtypes = [ctypes.c_void_p]
    fn.restype = None
    fn(context_handle)
