"""Where the server may connect when a client names a URL (remote media, the MCP proxy).

A URL in a request is chosen by whoever sent it, so the server must not become their way
into places only it can reach: the cloud metadata service, link-local devices, and (for
media) this machine's loopback services and the private network. `resolve_allowed` resolves
the host once, checks every address it resolves to, and returns one address to connect to,
so a name cannot resolve to a harmless address for the check and a forbidden one for the
connection (DNS rebinding between the two). `pinned_request_args` turns that address into
what httpx needs to connect there while still speaking to the name (Host, TLS SNI and
certificate check).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud metadata endpoints that are not link-local (AWS's IPv6 one, Alibaba's), besides
# 169.254.169.254 which the link-local rule already covers.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200"))


class AddressRefused(ValueError):
    """The URL's host is, or resolves to, an address this kind of fetch may not reach."""


@dataclass(frozen=True)
class Reach:
    """Which addresses a kind of fetch may reach. Link-local and metadata addresses never."""

    loopback: bool  # this machine (127.0.0.0/8, ::1)
    private: bool  # private, shared (CGNAT) and other non-global unicast ranges


MEDIA_PUBLIC_ONLY = Reach(loopback=False, private=False)
MEDIA_WITH_PRIVATE = Reach(loopback=True, private=True)
# The MCP proxy exists to reach MCP servers the user runs, often on this machine or the LAN.
PROXY = Reach(loopback=True, private=True)


def _unmapped(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (::ffff:127.0.0.1) judged as the IPv4 address it is."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_problem(ip: IPAddress, reach: Reach) -> str | None:
    """Why `ip` may not be reached under `reach`, or None when it may."""
    ip = _unmapped(ip)
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        return "not a unicast address"
    if ip.is_loopback:
        return None if reach.loopback else "a loopback address (this machine)"
    if not ip.is_global:
        return None if reach.private else "a private address"
    return None


async def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise AddressRefused(f"cannot resolve {host}: {exc.strerror or exc}") from None
    # Scope ids ("fe80::1%eth0") are not part of the address.
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


async def resolve_allowed(url: str, reach: Reach) -> str:
    """The address to connect to for `url` (http or https), every resolved address checked."""
    parts = urlsplit(url)
    host = parts.hostname
    if not host:
        raise AddressRefused("the URL has no host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = await _resolve(host, port)
    if not addresses:
        raise AddressRefused(f"{host} resolves to no address")
    for ip in addresses:
        problem = address_problem(ip, reach)
        if problem is not None:
            shown = host if host == str(ip) else f"{host} ({ip})"
            raise AddressRefused(f"{shown} is {problem}")
    return str(addresses[0])


def pinned_request_args(url: str, address: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """(url, headers, extensions) for httpx that connect to `address` but speak to the URL's
    name: the Host header keeps the name, and for https so do SNI and the certificate check."""
    parts = urlsplit(url)
    name = parts.hostname or ""
    ip_host = f"[{address}]" if ":" in address else address
    netloc = ip_host if parts.port is None else f"{ip_host}:{parts.port}"
    pinned = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    host_header = parts.netloc.rpartition("@")[2]
    extensions: dict[str, Any] = {"sni_hostname": name} if parts.scheme == "https" else {}
    return pinned, {"host": host_header}, extensions
