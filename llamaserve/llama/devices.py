"""ggml's backend devices and buffer types, bound with ctypes (llama-cpp-python does not bind them).

`-dev`, `--list-devices`, `-ot` and the CPU thread pool need them. The libraries are the ones
llama-cpp-python already loaded, so the handles and the device registry are shared with llama.cpp.
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass

import llama_cpp

# llama-cpp-python loads its libraries from LLAMA_CPP_LIB_PATH when set (an RPC build,
# scripts/build_rpc.sh): the same files here, or the device registry would not be llama.cpp's.
_LIB_DIR = os.environ.get("LLAMA_CPP_LIB_PATH") or os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
DEVICE_TYPE_CPU = 0
RPC_CONNECT_TIMEOUT_S = 5.0
DEVICE_TYPE_GPU = 1
DEVICE_TYPE_IGPU = 2


def native_library(name: str) -> ctypes.CDLL:
    """One of llama.cpp's shared libraries, from where llama-cpp-python loaded its own."""
    return ctypes.CDLL(os.path.join(_LIB_DIR, name))


_ggml = native_library("libggml.so")
_base = native_library("libggml-base.so")

_ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
_ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
_ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
_ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
_ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
_ggml.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
_ggml.ggml_backend_reg_by_name.restype = ctypes.c_void_p
_ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
_ggml.ggml_backend_register.restype = None
# ggml_backend_reg_t (*)(const char * endpoint): the RPC backend's ggml_backend_rpc_add_server.
_ADD_RPC_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_rpc_registered: set[str] = set()
for _fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
    getattr(_base, _fn).argtypes = [ctypes.c_void_p]
    getattr(_base, _fn).restype = ctypes.c_char_p
_base.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
_base.ggml_backend_dev_type.restype = ctypes.c_int
_base.ggml_backend_dev_memory.argtypes = [
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.POINTER(ctypes.c_size_t),
]
_base.ggml_backend_dev_memory.restype = None
_base.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
_base.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
_base.ggml_backend_dev_host_buffer_type.argtypes = [ctypes.c_void_p]
_base.ggml_backend_dev_host_buffer_type.restype = ctypes.c_void_p
_base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
_base.ggml_backend_buft_name.restype = ctypes.c_char_p
_base.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
_base.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
_base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p

# ggml_backend_dev_t * (*)(ggml_backend_dev_t): the CPU backend's extra buffer types (repacked weights).
_EXTRA_BUFTS = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


@dataclass(frozen=True)
class Device:
    handle: int
    name: str
    description: str
    kind: int
    free_bytes: int
    total_bytes: int

    @property
    def offloads(self) -> bool:
        """A GPU (discrete or integrated): what -dev, -ngl and -ts act on."""
        return self.kind in (DEVICE_TYPE_GPU, DEVICE_TYPE_IGPU)


def all_devices() -> list[Device]:
    from llamaserve.llama.model import ensure_backend  # here: model.py imports this module's users

    ensure_backend()
    out: list[Device] = []
    for i in range(_ggml.ggml_backend_dev_count()):
        dev = _ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(
            Device(
                handle=int(dev),
                name=(_base.ggml_backend_dev_name(dev) or b"").decode(),
                description=(_base.ggml_backend_dev_description(dev) or b"").decode(),
                kind=int(_base.ggml_backend_dev_type(dev)),
                free_bytes=int(free.value),
                total_bytes=int(total.value),
            )
        )
    return out


def offload_devices() -> list[Device]:
    """The devices llama-server lists and offloads to (GPUs; the CPU is always there)."""
    return [d for d in all_devices() if d.offloads]


def list_devices_text() -> str:
    lines = ["Available devices:"]
    for dev in offload_devices():
        lines.append(
            f"  {dev.name}: {dev.description} ({dev.total_bytes // 2**20} MiB, {dev.free_bytes // 2**20} MiB free)"
        )
    if len(lines) == 1:
        lines.append("  (none: this build of llama.cpp has no GPU backend, everything runs on the CPU)")
    return "\n".join(lines) + "\n"


class DeviceError(ValueError):
    """A -dev or -ot name that this build does not have."""


def pick_devices(spec: str) -> list[Device]:
    """`-dev A,B` → those devices; `none` → no offload (an empty list)."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if names == ["none"]:
        return []
    known = {d.name: d for d in offload_devices()}
    out: list[Device] = []
    for name in names:
        if name not in known:
            available = ", ".join(known) or "none in this build"
            raise DeviceError(f"--device: unknown device '{name}' (available: {available})")
        out.append(known[name])
    return out


def pick_projector_device(spec: str) -> Device | None:
    """`-mmdev NAME` → that GPU; `none` → None (the projector stays on the CPU). One device
    only, never the CPU itself: llama-server's own rule (`invalid device: CPU`)."""
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if names == ["none"]:
        return None
    if len(names) != 1:
        raise DeviceError("--mmproj-device: only one device may be specified for mmproj")
    known = {d.name: d for d in offload_devices()}
    if names[0] not in known:
        available = ", ".join(known) or "none in this build"
        raise DeviceError(f"--mmproj-device: invalid device: {names[0]} (available: {available})")
    return known[names[0]]


def buffer_types() -> dict[str, int]:
    """Every buffer type `-ot` may name: each device's own, its host buffer, and the CPU's extras."""
    out: dict[str, int] = {}
    for dev in all_devices():
        for buft in (
            _base.ggml_backend_dev_buffer_type(dev.handle),
            _base.ggml_backend_dev_host_buffer_type(dev.handle),
        ):
            if buft:
                out[(_base.ggml_backend_buft_name(buft) or b"").decode()] = int(buft)
        if dev.kind == DEVICE_TYPE_CPU:
            reg = _base.ggml_backend_dev_backend_reg(dev.handle)
            address = _base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
            if address:
                extras = _EXTRA_BUFTS(address)(dev.handle)
                i = 0
                while extras and extras[i]:
                    out[(_base.ggml_backend_buft_name(extras[i]) or b"").decode()] = int(extras[i])
                    i += 1
    return out


def cpu_backend_reg() -> int:
    """The CPU backend's registry entry (its thread-pool functions are looked up through it)."""
    from llamaserve.llama.model import ensure_backend

    ensure_backend()
    dev = _ggml.ggml_backend_dev_by_type(DEVICE_TYPE_CPU)
    return int(_base.ggml_backend_dev_backend_reg(dev)) if dev else 0


def proc_address(reg: int, name: str) -> int:
    return int(_base.ggml_backend_reg_get_proc_address(reg, name.encode()) or 0)


def _reachable(endpoint: str) -> None:
    """A clear error for a bad or unreachable endpoint (llama.cpp aborts the process on one)."""
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DeviceError(f"--rpc: not a host:port endpoint: {endpoint!r}")
    try:
        socket.create_connection((host, int(port)), timeout=RPC_CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise DeviceError(f"--rpc: cannot reach the RPC server {endpoint}: {exc}") from exc


def add_rpc_servers(endpoints: tuple[str, ...]) -> None:
    """--rpc: each `host:port` becomes a device of llama.cpp's RPC backend, as llama-server adds them.

    Registered once per process; the devices then take part in offloading like a GPU (-ngl).
    """
    reg = _ggml.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise DeviceError(
            "--rpc: this build of llama.cpp has no RPC backend (build one with scripts/bootstrap --rpc "
            "and start the server with LLAMA_CPP_LIB_PATH=.rpc/lib)"
        )
    address = proc_address(reg, "ggml_backend_rpc_add_server")
    if not address:
        raise DeviceError("--rpc: the RPC backend lacks ggml_backend_rpc_add_server")
    add = _ADD_RPC_SERVER(address)
    for endpoint in endpoints:
        if endpoint in _rpc_registered:
            continue
        _reachable(endpoint)
        server = add(endpoint.encode())
        if not server:
            raise DeviceError(f"--rpc: could not add the RPC server {endpoint}")
        _ggml.ggml_backend_register(server)
        _rpc_registered.add(endpoint)
