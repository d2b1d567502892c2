"""The OpenTelemetry SDK set up from our settings: resource, exporter, batch processor.

Imported only when tracing is on (telemetry/tracing.py). The SDK and the exporter read the
OTEL_* variables we do not (headers, timeouts, compression, sampler, batch sizes, resource
attributes) themselves.
"""

from __future__ import annotations

import importlib.metadata

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Tracer

from llamaserve.config import ConfigError
from llamaserve.telemetry.settings import TraceSettings

SCOPE = "llamaserve"


def exporter_for(settings: TraceSettings) -> SpanExporter:
    if settings.exporter == "console":
        return ConsoleSpanExporter()
    if settings.protocol == "grpc":
        try:  # not in the otel extra (grpcio is large): mypy may not find it
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as exc:
            raise ConfigError(
                "OTLP over gRPC needs the opentelemetry-exporter-otlp-proto-grpc package "
                "(the otel extra brings OTLP over HTTP: OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)"
            ) from exc
        grpc: SpanExporter = GrpcExporter(endpoint=settings.endpoint) if settings.endpoint else GrpcExporter()
        return grpc
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=settings.endpoint) if settings.endpoint else HttpExporter()


def build_provider(exporter: SpanExporter, service: str, *, batch: bool = True) -> TracerProvider:
    """A provider whose spans go to `exporter`; `service` unless the OTEL_* variables name one."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource)
    if batch:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    else:  # tests: each span exported as it ends
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor

        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def tracer_of(provider: TracerProvider) -> Tracer:
    try:
        version: str | None = importlib.metadata.version("llamaserve")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = None
    return provider.get_tracer(SCOPE, version)


def install(settings: TraceSettings, service: str) -> Tracer:
    """The process's tracer, on a provider of its own that the SDK flushes at exit.

    Not made OpenTelemetry's global provider: FastAPI (0.16x) traces every request itself as
    soon as the global provider is configured, which would give each request a second SERVER
    span and spans for its dependencies and serialization, at a cost per request."""
    return tracer_of(build_provider(exporter_for(settings), service))
