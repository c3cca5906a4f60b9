"""What a BatchExecutor tells observers: a span per batch, a BatchRecord per batch, load stats.

A base class rather than a helper object so that the per-batch calls from ``executor.py``
stay one plain method call each.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from opentelemetry import context as otel_context
from opentelemetry import trace

from ..telemetry.tracing import is_tracing
from .records import BatchRecord, Dispatch
from .window_stats import WindowStats

__all__ = ["BatchReporting"]

# the executor's logger, so that log filters on it still see these messages
log = logging.getLogger("inferway.backends.batching.executor")

_ROOT_CONTEXT = otel_context.Context()  # batch spans are roots, linked to their requests


class BatchReporting:
    """Base of BatchExecutor: its ``__init__`` sets these."""

    name: str
    clock: Callable[[], float]
    _on_batch: Callable[[BatchRecord], None] | None
    _tracer: trace.Tracer
    _span_name: str
    _stats: WindowStats

    def utilization(self) -> float:
        """Busy fraction of all instances over the recent stats window, in [0, 1]."""
        return self._stats.utilization(self.clock())

    def rps(self) -> float:
        """Requests computed per second over the recent stats window."""
        return self._stats.rps(self.clock())

    def _start_span(self, instance: int, batch: Dispatch, started: float) -> trace.Span:
        if not is_tracing(self._tracer):
            return trace.INVALID_SPAN  # no SDK: skip building links and attributes
        reqs = batch.requests
        links = [trace.Link(ctx) for ctx in (r.payload[2] for r in reqs) if ctx.is_valid]
        return self._tracer.start_span(
            self._span_name,
            context=_ROOT_CONTEXT,
            links=links,
            attributes={
                "batch.size": batch.rows,
                "batch.requests": len(reqs),
                "batch.queue_wait_max_s": started - reqs[0].arrival,
                "batch.instance": instance,
            },
        )

    def _report(
        self,
        instance: int,
        batch: Dispatch,
        started: float,
        compute_s: float,
        error: BaseException | None,
    ) -> None:
        if self._on_batch is None:
            return
        record = BatchRecord(
            name=self.name,
            size_rows=batch.rows,
            requests=len(batch.requests),
            queue_wait_s=[started - r.arrival for r in batch.requests],
            compute_s=compute_s,
            started_at=started,
            instance=instance,
            error=None if error is None else f"{type(error).__name__}: {error}",
        )
        try:
            self._on_batch(record)
        except Exception:
            log.exception("model %r: on_batch callback failed", self.name)
