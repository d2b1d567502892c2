"""OpenTelemetry traces, the optional `otel` extra: the one part that imports `opentelemetry`.

Importing this package (or `hook`, `settings`, `tracing`) loads no OpenTelemetry: the SDK,
the exporter and the span code are imported only once `tracing.start_tracing` finds that
the flags or the OTEL_* variables ask for traces, so a server without them pays neither the
import time nor a per-request cost.
"""
