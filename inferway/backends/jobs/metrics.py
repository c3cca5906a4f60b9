"""The jobs' Prometheus metrics, in the backend's registry: jobs held by state, the queue's
length and the age of its oldest job (read from the store's last stats, refreshed about once a
second, since a Redis store cannot be asked during a scrape), and this process's counts of
submissions, finished jobs and callback deliveries with the time jobs waited and took."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferway.backends.jobs.records import JobState
from inferway.backends.jobs.store import JobStats

__all__ = ["JobMetrics"]

_PREFIX = "inferway_backend_jobs"
_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


class _StoreGauges(Collector):
    def __init__(self, owner: JobMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[Metric]:
        stats = self._owner.stats
        if stats is None:
            return
        by_state = GaugeMetricFamily(
            _PREFIX, "Jobs held by the job store, by state.", labels=["state"]
        )
        for state in JobState:
            by_state.add_metric([str(state)], float(stats.by_state.get(state, 0)))
        yield by_state
        yield GaugeMetricFamily(
            f"{_PREFIX}_queue_length", "Jobs waiting to start.", value=float(stats.queue_length)
        )
        yield GaugeMetricFamily(
            f"{_PREFIX}_oldest_queued_seconds",
            "How long the oldest job waiting to start has waited (0: none waits).",
            value=stats.oldest_queued_s,
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())


class JobMetrics:
    """Registered once per backend on ``registry``; ``stats`` is set by the job service."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.stats: JobStats | None = None
        registry.register(_StoreGauges(self))
        self.submitted = Counter(f"{_PREFIX}_submitted", "Jobs accepted (202).", registry=registry)
        self.refused = Counter(
            f"{_PREFIX}_refused",
            "Job submissions refused because the store was full (429) or unreachable (503).",
            ["reason"],
            registry=registry,
        )
        self.finished = Counter(
            f"{_PREFIX}_finished",
            "Jobs this process's workers settled, by final state.",
            ["state"],
            registry=registry,
        )
        self.queue_wait = Histogram(
            f"{_PREFIX}_queue_wait_seconds",
            "Time from a job's submission to its (latest) start.",
            buckets=_BUCKETS,
            registry=registry,
        )
        self.duration = Histogram(
            f"{_PREFIX}_duration_seconds",
            "Time from a job's submission to its end, by final state.",
            ["state"],
            buckets=_BUCKETS,
            registry=registry,
        )
        self.callbacks = Counter(
            f"{_PREFIX}_callbacks",
            "Callback deliveries settled, by outcome (delivered or failed after retries).",
            ["outcome"],
            registry=registry,
        )
