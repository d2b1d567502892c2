"""The listening sockets: --host (comma-separated addresses, `.sock` paths), --port, --reuse-port.

Bound here, before the model loads, and handed to uvicorn, as llama-server binds every
address before loading (server-http.cpp): a busy port fails at once, not after a load.
Each TCP socket gets SO_REUSEADDR, and SO_REUSEPORT with --reuse-port; with several TCP
addresses an IPv6 one is IPv6-only, so `::` does not also claim 0.0.0.0 beside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from dataclasses import dataclass

from llamaserve.config import ServerConfig

log = logging.getLogger("llamaserve")


class BindError(OSError):
    """One address could not be bound; says which, in llama-server's words."""


@dataclass(frozen=True)
class Listener:
    sock: socket.socket
    address: str  # what the log shows: http://127.0.0.1:8080, http://[::1]:8080, unix:///run/x.sock
    path: str | None = None  # a UNIX socket's file, removed when the server stops


def is_unix(host: str) -> bool:
    return host.endswith(".sock")


def open_listeners(config: ServerConfig) -> list[Listener]:
    """One bound socket per --host entry; BindError (with none left open) if one fails."""
    n_tcp = sum(1 for host in config.hosts if not is_unix(host))
    scheme = "https" if config.ssl_cert_file else "http"
    listeners: list[Listener] = []
    try:
        for host in config.hosts:
            if is_unix(host):
                listeners.append(_unix(host))
            else:
                listeners.append(_tcp(host, config.port, scheme, reuse_port=config.reuse_port, v6only=n_tcp > 1))
    except BindError:
        close_listeners(listeners)
        raise
    return listeners


def close_listeners(listeners: list[Listener]) -> None:
    for listener in listeners:
        listener.sock.close()
        if listener.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(listener.path)


def _tcp(host: str, port: int, scheme: str, *, reuse_port: bool, v6only: bool) -> Listener:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise BindError(f"couldn't bind HTTP server socket, hostname: {host}, port: {port}: {exc}") from exc
    last: OSError | None = None
    for family, kind, proto, _, addr in infos:  # the first address that binds, as getaddrinfo orders them
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                if hasattr(socket, "SO_REUSEPORT"):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                else:
                    log.warning("SO_REUSEPORT is not supported")
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1 if v6only else 0)
            sock.bind(addr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        shown = f"[{host}]" if ":" in host else host
        return Listener(sock, f"{scheme}://{shown}:{port}")
    raise BindError(f"couldn't bind HTTP server socket, hostname: {host}, port: {port}: {last}")


def _unix(path: str) -> Listener:
    _remove_stale_socket(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise BindError(f"couldn't bind HTTP server socket, hostname: {path}: {exc}") from exc
    return Listener(sock, f"unix://{path}", path)


def _remove_stale_socket(path: str) -> None:
    """A socket file nobody answers on is what a killed server leaves behind; it would
    block the bind, so it goes. A live server's socket, or any other file, is kept (the
    bind then fails and says so)."""
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return
    except OSError:
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
    finally:
        probe.close()
