"""Metric samples of one service and the replica count a metric value asks for.

Additive metrics (queue length, requests in flight, request rate, LLM tokens per second)
are service totals, so the
replicas they need are ``total / target``; mean metrics (utilization, p99 latency, queue wait)
are already per replica, so they scale the ready count by ``value / target``, as Kubernetes'
HPA does.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

__all__ = [
    "ADDITIVE_METRICS",
    "METRICS",
    "MetricSample",
    "SampleWindow",
    "needed_replicas",
]

ADDITIVE_METRICS = ("queue_length", "in_flight", "request_rate", "token_rate")
METRICS = (*ADDITIVE_METRICS, "utilization", "p99_latency", "queue_wait")


@dataclass(frozen=True)
class MetricSample:
    """One scrape of a service: totals over its ready replicas, and their mean utilization.

    ``p99_latency`` is in seconds, ``utilization`` in [0, 1]; ``queue_wait`` is the mean
    time the requests of the interval waited in the replicas' queues (seconds), which, unlike
    the queue's length, does not count the requests a delay-bound batcher holds on purpose as
    a shortage once the threshold is above its delay. ``token_rate`` is the LLM tokens (input
    and output) per second the gateway counted for the service.
    A value the source did not report is None (a decision on a missing metric holds the
    replica count).
    """

    time: float
    queue_length: float | None = None
    in_flight: float | None = None
    request_rate: float | None = None
    token_rate: float | None = None
    p99_latency: float | None = None
    utilization: float | None = None
    queue_wait: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in ("time", *METRICS)}

    @classmethod
    def from_json(cls, data: Mapping[str, float | None]) -> MetricSample:
        return cls(time=float(data["time"] or 0.0), **{m: data.get(m) for m in METRICS})

    def value(self, metric: str) -> float | None:
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
        value = getattr(self, metric)
        if value is None or not math.isfinite(value):
            return None
        return float(value)


def needed_replicas(metric: str, value: float, *, ready: int, target: float) -> float:
    """Replicas (fractional) that would bring ``metric`` to ``target`` per replica."""
    if metric in ADDITIVE_METRICS:
        return max(value, 0.0) / target
    return max(ready, 1) * max(value, 0.0) / target


class SampleWindow:
    """The samples of the last ``span_s`` seconds, oldest first."""

    def __init__(self, span_s: float) -> None:
        self._span = span_s
        self._samples: deque[MetricSample] = deque()

    @property
    def span_s(self) -> float:
        return self._span

    def add(self, sample: MetricSample) -> None:
        if self._samples and sample.time < self._samples[-1].time:
            raise ValueError(
                f"sample at t={sample.time} is older than the last one "
                f"(t={self._samples[-1].time}); samples must arrive in time order"
            )
        self._samples.append(sample)
        while self._samples and self._samples[0].time < sample.time - self._span:
            self._samples.popleft()

    def __iter__(self) -> Iterator[MetricSample]:
        return iter(self._samples)

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def latest(self) -> MetricSample | None:
        return self._samples[-1] if self._samples else None

    def mean(self, metric: str, *, now: float, span_s: float) -> float | None:
        """Mean of ``metric`` over samples in ``(now - span_s, now]``; the latest alone when
        none is that recent (a sampling interval longer than the span)."""
        values = [
            v
            for s in self._samples
            if s.time > now - span_s and s.time <= now and (v := s.value(metric)) is not None
        ]
        if values:
            return sum(values) / len(values)
        latest = self.latest
        return latest.value(metric) if latest is not None and latest.time <= now else None
