"""OpenTelemetry tracing for every vgpu-dra process: off unless an OTLP endpoint is configured.

Why a shared module: the kubelet plugin and the controller install the same tracer
provider the same way, from the same flag (`--otlp-endpoint`, or the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` environment variable). Code is instrumented with the OpenTelemetry
API only (`trace.get_tracer(...)`); without a provider those spans are non-recording no-ops
(measured in bench/telemetry_bench.py), so tracing costs nothing when it is off and the SDK and
exporter are not even imported.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from opentelemetry import trace

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)

OTLP_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"


def configure_tracing(service: str, endpoint: str | None) -> TracerProvider | None:
    """Install a global provider exporting to `endpoint` over OTLP/gRPC; None when not asked.

    Transport as the OpenTelemetry SDK decides it: `http://host:port` in plain text, `https://`
    over TLS, a bare `host:port` over TLS unless `OTEL_EXPORTER_OTLP_INSECURE=true`. Spans are
    batched and exported from a background thread, never on the caller's path.
    """
    if not endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporter = OTLPSpanExporter(endpoint=endpoint)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("exporting traces over OTLP", extra={"endpoint": endpoint, "service": service})
    return provider


def installed_tracer(name: str) -> trace.Tracer | None:
    """The tracer `name` once a real provider is installed (configure_tracing, or a test's), None
    while tracing is off: callers then create no span at all, because even the API's no-op spans
    cost about 5-25 us each (bench/telemetry_bench.py)."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None
    return trace.get_tracer(name)


def shutdown_tracing(provider: TracerProvider | None) -> None:
    """Flush what is buffered (bounded by the exporter's timeout) and stop the exporter."""
    if provider is not None:
        provider.shutdown()
