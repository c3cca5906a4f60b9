"""Prometheus metrics of pipelines: step-result cache hits, misses, evictions and size, the
rows each expert of a mixture was given (its activation frequency, as a rate), and each
step's time. Registered in the backend's own registry, beside its request metrics."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["PipelineMetrics"]

_PREFIX = "inferway_backend_pipeline"
_STEP_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class PipelineMetrics:
    """The counters a PipelineExecutor feeds (labelled children cached: hot path)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.cache_requests = Counter(
            f"{_PREFIX}_cache_requests",
            "Step-result cache lookups of cached steps, by result (hit or miss).",
            ["pipeline", "step", "result"],
            registry=self.registry,
        )
        self.cache_evictions = Counter(
            f"{_PREFIX}_cache_evictions",
            "Results dropped from a pipeline's cache, by reason (budget or expired).",
            ["pipeline", "reason"],
            registry=self.registry,
        )
        self.cache_bytes = Gauge(
            f"{_PREFIX}_cache_bytes",
            "Bytes of step results a pipeline's cache holds.",
            ["pipeline"],
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.expert_rows = Counter(
            f"{_PREFIX}_expert_activations",
            "Rows routed to each expert of a mixture-of-experts step.",
            ["pipeline", "step", "expert"],
            registry=self.registry,
        )
        self.step_duration = Histogram(
            f"{_PREFIX}_step_duration_seconds",
            "Time one pipeline step took (cache hits included), per step.",
            ["pipeline", "step"],
            buckets=_STEP_BUCKETS,
            registry=self.registry,
        )
        self._children: dict[tuple[str, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def cache_lookup(self, pipeline: str, step: str, hit: bool) -> None:
        self._child(self.cache_requests, pipeline, step, "hit" if hit else "miss").inc()

    def cache_evicted(self, pipeline: str, reason: str, count: int = 1) -> None:
        self._child(self.cache_evictions, pipeline, reason).inc(count)

    def cache_size(self, pipeline: str, nbytes: int) -> None:
        self._child(self.cache_bytes, pipeline).set(nbytes)

    def expert_activated(self, pipeline: str, step: str, expert: str, rows: int) -> None:
        self._child(self.expert_rows, pipeline, step, expert).inc(rows)

    def step_finished(self, pipeline: str, step: str, seconds: float) -> None:
        self._child(self.step_duration, pipeline, step).observe(seconds)
