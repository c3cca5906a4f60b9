"""One OpenTelemetry span per inference request, continuing the caller's trace.

The span is made current while the handler awaits ``executor.infer()``, which is how the
batching layer links its "batch <model>" span to every request it served.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    INVALID_SPAN,
    NoOpTracer,
    ProxyTracer,
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    TracerProvider,
)

__all__ = [
    "REQUEST_ID_ATTRIBUTE",
    "REQUEST_ID_HEADER",
    "backend_tracer",
    "extract_context",
    "is_tracing",
    "request_span",
    "set_span_outcome",
]

_tracer = trace.get_tracer("inferway.backends")

REQUEST_ID_HEADER = "x-request-id"
"""Envoy's request id: generated at the edge, forwarded upstream, echoed back by the backend."""
REQUEST_ID_ATTRIBUTE = "request_id"
"""Span attribute carrying x-request-id (the same key Envoy's custom tag uses)."""


def backend_tracer(provider: TracerProvider | None) -> Tracer:
    """The request-span tracer: from ``provider``, or the global one when None."""
    return _tracer if provider is None else provider.get_tracer("inferway.backends")


def is_tracing(tracer: Tracer | None) -> bool:
    """False when ``tracer`` (the global one when None) is OpenTelemetry's no-op, i.e. no SDK
    is configured: then a request needs no span, no context and no propagation work. Asked per
    request, so a provider installed later is picked up."""
    t = tracer or _tracer
    if isinstance(t, ProxyTracer):
        t = t._tracer  # the global provider's tracer once one is set, else its no-op
    return not isinstance(t, NoOpTracer)


def extract_context(carrier: Mapping[str, str] | Iterable[tuple[str, str | bytes]]) -> Context:
    """The caller's trace context from HTTP headers or gRPC metadata (W3C traceparent by
    default; whatever the global propagator understands)."""
    if isinstance(carrier, Mapping):
        headers = {k.lower(): v for k, v in carrier.items()}
    else:
        headers = {k.lower(): v for k, v in carrier if isinstance(v, str)}
    return propagate.extract(headers)


@contextmanager
def request_span(
    model: str,
    *,
    protocol: str,
    parent: Context | None,
    request_id: str | None = None,
    tracer: Tracer | None = None,
) -> Iterator[Span]:
    """A SERVER span "infer <model>", current for the body of the ``with``. ``request_id`` is
    the edge's x-request-id (kept end to end so logs and spans can be joined). Without an SDK
    (see :func:`is_tracing`) this yields the invalid span and costs next to nothing."""
    if not is_tracing(tracer):
        yield INVALID_SPAN
        return
    attributes = {
        "inferway.model": model,
        "rpc.system" if protocol == "grpc" else "http.scheme": protocol,
    }
    if request_id:
        attributes[REQUEST_ID_ATTRIBUTE] = request_id
    with (tracer or _tracer).start_as_current_span(
        f"infer {model}",
        context=parent,
        kind=SpanKind.SERVER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def set_span_outcome(
    span: Span, *, code: str | int, version: str, error: str | None, fault: bool = False
) -> None:
    """Record the answer on the span. Only server faults (5xx; INTERNAL, UNAVAILABLE,
    DEADLINE_EXCEEDED) mark it as an error, as OpenTelemetry's conventions ask; a client's
    mistake is noted in ``inferway.error`` but is not the server's failure."""
    span.set_attribute("inferway.model_version", version)
    span.set_attribute("inferway.status_code", str(code))
    if error is not None:
        span.set_attribute("inferway.error", error)
        if fault:
            span.set_status(Status(StatusCode.ERROR, error))
