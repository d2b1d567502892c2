"""Whether this process traces, and where the spans go: from the flags and OTEL_* variables.

Plain Python: deciding must not import OpenTelemetry, so a server without tracing never
loads it. The variables are OpenTelemetry's own (the SDK and the OTLP exporter read the rest
of them themselves: headers, timeouts, sampler, batch sizes, resource attributes).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from llamaserve.config import ConfigError, ServerConfig

EXPORTERS = ("otlp", "console")
PROTOCOLS = ("http/protobuf", "grpc")
TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class TraceSettings:
    exporter: str  # otlp | console
    protocol: str  # http/protobuf | grpc (otlp only)
    endpoint: str | None  # the traces URL of --otlp-endpoint; None: the exporter reads OTEL_* itself


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def traces_url(endpoint: str) -> str:
    """`--otlp-endpoint` over OTLP/HTTP: a base URL gets OTLP/HTTP's traces path, as OTEL_EXPORTER_OTLP_ENDPOINT
    does; a URL with a path of its own is used as given (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT's rule)."""
    path = urllib.parse.urlsplit(endpoint).path
    return endpoint.rstrip("/") + TRACES_PATH if path in ("", "/") else endpoint


def trace_settings(config: ServerConfig, environ: Mapping[str, str]) -> TraceSettings | None:
    """None when tracing is off: neither flag given and no OTEL_* variable asking for traces, or
    OTEL_SDK_DISABLED=true / OTEL_TRACES_EXPORTER=none (OpenTelemetry's own off switches win)."""
    if _true(environ.get("OTEL_SDK_DISABLED")):
        return None
    exporter_var = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter_var == "none":
        return None
    wanted = (
        config.otel
        or bool(config.otlp_endpoint)
        or bool(exporter_var)
        or bool(environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
        or bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    )
    if not wanted:
        return None
    exporter = exporter_var or "otlp"
    if "," in exporter:
        raise ConfigError(f"OTEL_TRACES_EXPORTER: one exporter please (otlp or console), got {exporter!r}")
    if exporter not in EXPORTERS:
        raise ConfigError(f"OTEL_TRACES_EXPORTER: {exporter!r} is not supported (otlp, console or none)")
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or PROTOCOLS[0]
    ).strip()
    if protocol not in PROTOCOLS:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported (http/protobuf or grpc)")
    if config.otlp_endpoint:
        if exporter != "otlp":
            raise ConfigError(f"--otlp-endpoint needs the otlp exporter, but OTEL_TRACES_EXPORTER is {exporter!r}")
        # OTLP/HTTP posts to a path; gRPC takes the collector's address as it is.
        url = traces_url(config.otlp_endpoint) if protocol == "http/protobuf" else config.otlp_endpoint
        return TraceSettings("otlp", protocol, url)
    return TraceSettings(exporter, protocol, None)
