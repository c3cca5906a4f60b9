"""OpenTelemetry SDK setup for inferway processes: one call, OTLP when an endpoint is given."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

__all__ = ["setup_tracing"]


def setup_tracing(
    service_name: str,
    otlp_endpoint: str | None = None,
    sample_ratio: float = 1.0,
    *,
    exporters: Sequence[SpanExporter] = (),
    set_global: bool = True,
) -> TracerProvider:
    """Build a TracerProvider exporting over OTLP/gRPC to ``otlp_endpoint`` (none if None) and
    to any extra ``exporters`` (tests pass an InMemorySpanExporter), each behind a
    BatchSpanProcessor. Sampling is parent-based: a caller's sampled trace is always kept, new
    traces are kept with probability ``sample_ratio``.

    With ``set_global`` it becomes the process's tracer provider. OpenTelemetry lets that be set
    only once; if an SDK provider is already installed, the exporters are added to it instead
    and it is returned, so calling this twice never silently drops spans.
    """
    if not 0.0 <= sample_ratio <= 1.0:
        raise ValueError(f"sample_ratio must lie in [0, 1], got {sample_ratio}")
    all_exporters: list[SpanExporter] = list(exporters)
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        insecure = not otlp_endpoint.startswith("https://")
        all_exporters.append(OTLPSpanExporter(endpoint=otlp_endpoint, insecure=insecure))
    current = trace.get_tracer_provider()
    if set_global and isinstance(current, TracerProvider):
        provider = current
    else:
        provider = TracerProvider(
            resource=Resource.create({SERVICE_NAME: service_name}),
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
        )
        if set_global:
            trace.set_tracer_provider(provider)
    for exporter in all_exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
