"""What a BatchExecutor tells observers about each batch: an OpenTelemetry span (a root span
linked to the spans of the requests it served) and a BatchRecord for metrics and benchmarks.
A collaborator the executor owns, so tracing and reporting stay out of the batching code."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace

from ..telemetry.tracing import is_tracing
from .queued import QueuedRequest
from .records import BatchRecord

__all__ = ["BatchReporter"]

# the executor's logger, so that log filters on it still see these messages
log = logging.getLogger("inferway.backends.batching.executor")

_ROOT_CONTEXT = otel_context.Context()  # batch spans are roots, linked to their requests


class BatchReporter:
    """Spans and records of one model's batches."""

    def __init__(
        self,
        name: str,
        *,
        on_batch: Callable[[BatchRecord], None] | None,
        tracer_provider: trace.TracerProvider | None,
    ) -> None:
        self.name = name
        self._on_batch = on_batch
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer("inferway.backends.batching")
        self._span_name = f"batch {name}"

    def start_span(
        self,
        instance: int,
        requests: Sequence[QueuedRequest],
        rows: int,
        started: float,
        *,
        on_loop: bool = False,
    ) -> trace.Span:
        """The batch's span, linked to its requests' spans; ``batch.thread`` says where it
        computes (``compute_thread``): ``loop`` or ``worker``."""
        if not is_tracing(self._tracer):
            return trace.INVALID_SPAN  # no SDK: skip building links and attributes
        links = [trace.Link(r.span_context) for r in requests if r.span_context.is_valid]
        return self._tracer.start_span(
            self._span_name,
            context=_ROOT_CONTEXT,
            links=links,
            attributes={
                "batch.size": rows,
                "batch.requests": len(requests),
                "batch.queue_wait_max_s": started - requests[0].arrival,
                "batch.instance": instance,
                "batch.thread": "loop" if on_loop else "worker",
            },
        )

    def report(
        self,
        instance: int,
        requests: Sequence[QueuedRequest],
        rows: int,
        started: float,
        compute_s: float,
        error: BaseException | None,
    ) -> None:
        if self._on_batch is None:
            return
        record = BatchRecord(
            name=self.name,
            size_rows=rows,
            requests=len(requests),
            queue_wait_s=[started - r.arrival for r in requests],
            compute_s=compute_s,
            started_at=started,
            instance=instance,
            error=None if error is None else f"{type(error).__name__}: {error}",
        )
        try:
            self._on_batch(record)
        except Exception:
            log.exception("model %r: on_batch callback failed", self.name)
