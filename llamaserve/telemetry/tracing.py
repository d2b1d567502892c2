"""This process's tracer: started once at start-up when tracing is asked for, else never.

`start_tracing` is what each process (the model server, the router, the `--upstreams` front)
calls before it builds its app; the app shells then ask `request_tracer()` whether to add the
tracing middleware. OpenTelemetry is imported here only inside `start_tracing`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from llamaserve.config import ConfigError, ServerConfig
from llamaserve.telemetry.settings import trace_settings

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

_tracer: Tracer | None = None

INSTALL_HINT = "pip install 'llamaserve[otel]'"


def start_tracing(config: ServerConfig, environ: Mapping[str, str], service: str) -> bool:
    """Sets up the exporter and this process's tracer when tracing is asked for; whether it is.

    `service` is the default `service.name` (OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win).
    A ConfigError when the settings are wrong or the `otel` extra is not installed.
    """
    global _tracer
    settings = trace_settings(config, environ)
    if settings is None:
        return False
    try:
        from llamaserve.telemetry.provider import install
    except ImportError as exc:
        raise ConfigError(f"tracing needs the OpenTelemetry packages ({exc.name} is missing): {INSTALL_HINT}") from exc
    _tracer = install(settings, service)
    return True


def request_tracer() -> Tracer | None:
    """The tracer the app shells trace requests with; None when tracing is off."""
    return _tracer
