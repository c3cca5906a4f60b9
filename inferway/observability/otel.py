"""OpenTelemetry SDK setup for inferway processes: one call, OTLP when an endpoint is given."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)

__all__ = ["LinkAwareSampler", "build_sampler", "setup_tracing"]


class LinkAwareSampler(Sampler):
    """Root spans that link to other spans (a batch span serving many requests) are kept when
    any linked span was sampled and dropped when none was, so a request the edge chose not to
    trace leaves no batch span behind either; other roots use ``root``."""

    def __init__(self, root: Sampler) -> None:
        self._root = root

    def should_sample(  # type: ignore[no-untyped-def]
        self,
        parent_context,
        trace_id,
        name,
        kind=None,
        attributes=None,
        links=None,
        trace_state=None,
    ) -> SamplingResult:
        if links:
            sampled = any(link.context.trace_flags.sampled for link in links)
            return SamplingResult(
                Decision.RECORD_AND_SAMPLE if sampled else Decision.DROP, attributes
            )
        return self._root.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"LinkAwareSampler{{{self._root.get_description()}}}"


def build_sampler(sample_ratio: float) -> Sampler:
    """Parent-based: a caller's decision is followed; a new root is sampled with probability
    ``sample_ratio``, a linking root (batch span) follows the spans it links."""
    return ParentBased(LinkAwareSampler(TraceIdRatioBased(sample_ratio)))


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
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            # inferway needs no xds-protos at run time, but another package may still install
            # it, and its stale opentelemetry/proto/* copies then break the exporter's import.
            raise RuntimeError(
                f"cannot export traces to {otlp_endpoint}: {exc}. If xds-protos is installed "
                "in this environment it may have overwritten opentelemetry-proto's files: "
                "`pip install --force-reinstall --no-deps opentelemetry-proto` restores them"
            ) from exc

        insecure = not otlp_endpoint.startswith("https://")
        all_exporters.append(OTLPSpanExporter(endpoint=otlp_endpoint, insecure=insecure))
    current = trace.get_tracer_provider()
    if set_global and isinstance(current, TracerProvider):
        provider = current
    else:
        provider = TracerProvider(
            resource=Resource.create({SERVICE_NAME: service_name}),
            sampler=build_sampler(sample_ratio),
        )
        if set_global:
            trace.set_tracer_provider(provider)
    for exporter in all_exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
