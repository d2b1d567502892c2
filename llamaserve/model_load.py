"""Part of the composition root: the model file's load, begun as soon as the flags are parsed.

`cli` starts it before it imports the composition root, the engine and the app (most of the
start's time, all Python under the GIL); llama.cpp reads the weights in native code without
the GIL, so on two cores the load and those imports overlap instead of one waiting for the
other. `compose.load_runtime` then takes the loaded model and builds the rest around it. So
that the load starts early, this module imports only what loading needs: the llama.cpp
bindings with the llama/ modules that load a model, and the log set-up that llama.cpp's own
lines go through.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from llamaserve.api.load_bar import load_bar_for
from llamaserve.api.logs import setup_logging
from llamaserve.config import ConfigError, ServerConfig
from llamaserve.llama.load_params import ModelLoadSettings
from llamaserve.llama.logs import route_llama_logs
from llamaserve.llama.model import Model, gpu_offload_supported, init_numa
from llamaserve.llama.progress import set_load_progress

log = logging.getLogger("llamaserve")

# llama.cpp's patterns for the MoE expert tensors (common.h's LLM_FFN_EXPS_REGEX and friends).
_EXPS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def moe_overrides(cpu_moe: bool, n_cpu_moe: int) -> list[str]:
    """`--cpu-moe` / `-ncmoe N` (and their draft twins) as the tensor overrides llama-server makes of them."""
    out = [f"{_EXPS}=CPU"] if cpu_moe else []
    out += [rf"blk\.{layer}{_EXPS}=CPU" for layer in range(n_cpu_moe)]
    return out


def model_load_settings(config: ServerConfig) -> ModelLoadSettings:
    load = config.load
    # --cpu-moe/-ncmoe/-ncffn are tensor overrides onto the CPU buffer, as llama-server spells them.
    overrides = [*load.override_tensor, *moe_overrides(load.cpu_moe, load.n_cpu_moe)]
    for layer in range(load.n_cpu_ffn):
        overrides.append(rf"blk\.{layer}\.ffn_(up|down|gate)\.=CPU")
    return ModelLoadSettings(
        n_gpu_layers=load.n_gpu_layers,
        split_mode=load.split_mode,
        main_gpu=load.main_gpu,
        tensor_split=load.tensor_split,
        devices=load.devices,
        load_mode=load.effective_load_mode,
        lazy_mode=load.lazy_mode,
        check_tensors=load.check_tensors,
        repack=load.repack,
        no_host=load.no_host,
        override_kv=load.override_kv,
        override_tensor=tuple(overrides),
        rpc_servers=load.rpc_servers,
    )


# The spellings (and variables) of llama-server's fitting flags, as `config.hardware_flags` lists them.
_FIT_FLAGS = frozenset(
    {"-fit", "--fit", "LLAMA_ARG_FIT", "-fitt", "--fit-target", "LLAMA_ARG_FIT_TARGET"}
    | {"-fitc", "--fit-ctx", "LLAMA_ARG_FIT_CTX"}
)


def check_fit(config: ServerConfig) -> None:
    """--fit, -fitt, -fitc: llama-server (fit on by default) lowers the settings left unset
    (-ngl, -c, ...) until the model fits each device's memory with -fitt MiB to spare, never
    below -fitc tokens of context. That is llama.cpp's common library (`common_fit_params`),
    which llama-cpp-python does not ship, and llamaserve does not do it. Without a GPU backend
    there is no device memory to fit, in llama-server too: the values are checked and the flags
    announced as having no effect. With one, asking for fitting is refused, and the default
    (on) is said not to happen; `--fit off` is what runs."""
    load = config.load
    if not load.fit or not gpu_offload_supported():
        return
    asked = [flag for flag in config.hardware_flags if flag in _FIT_FLAGS]
    if asked:
        raise ConfigError(
            f"{asked[0]}: fitting the model into device memory (--fit on, -fitt "
            f"{','.join(map(str, load.fit_target))} MiB, -fitc {load.fit_ctx}) is not part of llamaserve: "
            "llama.cpp does it in its common library, which llama-cpp-python does not ship; "
            "pass --fit off and set -ngl and -c yourself"
        )
    log.warning(
        "llama-server fits the model into device memory by default (--fit on); llamaserve does not: "
        "it loads with -ngl %d and -c %d as set (pass --fit off to say so)",
        load.n_gpu_layers,
        config.ctx_size,
    )


# While llama.cpp loads, it calls into Python for every log line and progress report (over two
# thousand calls for the embedded model, most of them DEBUG lines our log drops), and each call
# waits for the GIL. A thread busy in Python (the start's imports, the event loop) hands the GIL
# over only after the switch interval, 5 ms by default: on two cores the embedded model's 0.07 s
# file load took 0.28 s beside the app's imports, 0.12 s with this interval, the imports no slower.
# The interval only matters while a thread waits, so it is kept short for as long as a load runs.
_LOAD_SWITCH_INTERVAL_S = 2e-5
_loads_running = [0, 0.0]  # loads in progress, and the interval to restore when the last one ends
_loads_lock = threading.Lock()


def _quick_gil_handoff(on: bool) -> None:
    with _loads_lock:
        if on:
            if _loads_running[0] == 0:
                _loads_running[1] = sys.getswitchinterval()
                sys.setswitchinterval(_LOAD_SWITCH_INTERVAL_S)
            _loads_running[0] += 1
        else:
            _loads_running[0] -= 1
            if _loads_running[0] == 0:
                sys.setswitchinterval(_loads_running[1])


class ModelLoad:
    """One load of `config.model` on a thread of its own; `take` waits for it and hands the model over.

    What the load raises (a refused --fit, bad load settings, a file llama.cpp cannot load)
    is raised again by `take`, in the thread that builds the runtime, as if it had loaded there.
    From its start to `done` (the runtime around the model is built: llama.cpp's calls into
    Python are over) or `discard`, the GIL is handed over quickly.
    """

    def __init__(self, config: ServerConfig) -> None:
        self._config = config
        self.settings = model_load_settings(config)
        self.started = time.perf_counter()  # "model loaded in X s" counts from here
        self._model: Model | None = None
        self._error: Exception | None = None
        self._taken = False
        self._running = True
        self._lock = threading.Lock()  # take() and discard() may race: the model goes to one of them
        _quick_gil_handoff(True)
        self._thread = threading.Thread(target=self._load, name="llamaserve-model-load", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        config = self._config
        try:
            check_fit(config)
            if config.load.numa:
                init_numa(config.load.numa)
            self._model = Model(config.model, self.settings)
        except Exception as exc:  # handed to whoever takes the model
            self._error = exc

    @property
    def pending(self) -> bool:
        """Not yet taken (nor discarded)."""
        return not self._taken

    def take(self) -> Model:
        """The loaded model, once; what the load raised, raised here."""
        self._thread.join()
        with self._lock:
            if self._taken:
                raise RuntimeError("the model of this load was already taken")
            self._taken = True
            model, self._model = self._model, None
        if model is None:
            assert self._error is not None
            raise self._error
        return model

    def done(self) -> None:
        """The runtime is built around the model, or failed to be: the load is over."""
        with self._lock:
            running, self._running = self._running, False
        if running:
            _quick_gil_handoff(False)

    def discard(self) -> None:
        """Stop a load nobody will take (the server ended before its loader ran) and free the model.

        The process must not exit while llama.cpp still reads on this thread: its static
        destructors would run under the load. A progress report that says stop ends it at the
        next tensor."""
        with self._lock:
            taken, self._taken = self._taken, True
        if not taken:
            set_load_progress(lambda _progress: False)
            self._thread.join()
            set_load_progress(None)
            if self._model is not None:
                self._model.close()
                self._model = None
        self.done()


def begin_model_load(config: ServerConfig) -> ModelLoad:
    """Set up logging (llama.cpp's lines too, which the load writes) and start loading `config.model`.

    A progress reporter is in place from the start, so the load can be stopped (`discard`); it
    draws the terminal's bar, since a small model can be loaded before the server starts. The
    server's own (the bar, a stop on shutdown) replaces it then, and the bridge asks whichever
    is current at each report."""
    setup_logging(config, route_llama_logs)
    draw = load_bar_for(config)

    def report(progress: float) -> bool:
        if draw is not None:
            draw(progress)
        return True

    set_load_progress(report)
    return ModelLoad(config)
