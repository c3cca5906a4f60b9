"""Prometheus metrics of one backend server, in its own registry (two servers in one process,
as in tests, never share or clash). Request metrics come from the protocol handlers, batch
metrics from BatchExecutor's ``on_batch`` records, gauges are read at scrape time.

With ``inferway serve --workers N`` each worker process writes its counters and histograms to
prometheus_client's multiprocess files (``shared_dir``) and ``render`` adds up every worker's;
the gauges become shared gauges that each worker refreshes (``refresh``, twice a second):
queue depth and in-flight batches are summed over the live workers, readiness is their
minimum, a model's load time their maximum."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferway.backends.batching.records import BatchRecord
from inferway.backends.telemetry.statistics import InferenceStatistics
from inferway.observability.gpu_memory import GpuMemoryCollector

__all__ = ["CONTENT_TYPE", "BackendMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PREFIX = "inferway_backend"
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _split_name(name: str) -> tuple[str, str]:
    """Executor names are ``model`` or ``model:version`` (see the repository)."""
    model, _, version = name.partition(":")
    return model, version


def _scheduler_value(model: Any, name: str) -> float | None:
    """An attribute of a model's batching scheduler; None for a pipeline (no scheduler)."""
    scheduler = getattr(model.executor, "scheduler", None)
    return None if scheduler is None else float(getattr(scheduler, name))


_MODEL_GAUGES: tuple[tuple[str, str, Callable[[Any], float | None], str], ...] = (
    (
        "queue_depth",
        "Requests waiting in the model's queue.",
        lambda m: m.executor.queue_depth,
        "livesum",
    ),
    (
        "inflight_batches",
        "Batches being computed right now.",
        lambda m: m.executor.in_flight_batches,
        "livesum",
    ),
    (
        "model_load_seconds",
        "How long loading and warming the model version took.",
        lambda m: m.load_seconds,
        "livemax",
    ),
    (
        "loop_busy",
        "The event loop's busy share as the model's batcher last saw it (0-1); from 0.8 "
        "adaptive batching waits for fuller batches (fill_when_busy).",
        lambda m: _scheduler_value(m, "loop_busy"),
        "livemax",
    ),
    (
        "batch_fill_waits",
        "Times, since the version loaded, adaptive batching waited for a fuller batch because "
        "the event loop was busy (fill_when_busy).",
        lambda m: _scheduler_value(m, "filled"),
        "livesum",
    ),
    (
        "batches_on_loop",
        "Batches, since the version loaded, computed on the event loop's thread "
        "(compute_thread: tiny ones, and a CPU model's while the process may use one CPU).",
        lambda m: getattr(m.executor, "batches_on_loop", None),
        "livesum",
    ),
    (
        "batch_return_waits",
        "Times, since the version loaded, adaptive batching held a batch for clients of "
        "answered batches to come back (wait_for_returns).",
        lambda m: _scheduler_value(m, "held"),
        "livesum",
    ),
)
"""Per model version: (name, help, value, how workers' values combine with ``--workers``); a
value of None (a pipeline has no batcher of its own) leaves the series out."""
_READY_HELP = "1 when the backend is ready to serve (every model loaded and warm), else 0."


class _ModelGauges(Collector):
    """Queue depth, in-flight batches and load time, read from the served models on scrape."""

    def __init__(self, models: Callable[[], Iterable[Any]]) -> None:
        self._models = models

    def collect(self) -> Iterator[Metric]:
        families = [
            (GaugeMetricFamily(f"{_PREFIX}_{name}", doc, labels=["model", "version"]), value)
            for name, doc, value, _ in _MODEL_GAUGES
        ]
        for m in self._models():
            labels = [str(m.name), str(m.version)]
            for family, value in families:
                got = value(m)
                if got is not None:
                    family.add_metric(labels, float(got))
        for family, _ in families:
            yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())  # collected lazily; nothing to check at registration


class _Readiness(Collector):
    """``inferway_backend_ready``: 1 once every model is loaded and warm (what /ready says)."""

    def __init__(self, ready: Callable[[], bool]) -> None:
        self._ready = ready

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            f"{_PREFIX}_ready", _READY_HELP, value=1.0 if self._ready() else 0.0
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())


class BackendMetrics:
    """All of one server's metrics. ``models`` returns the ServedModels to report gauges for,
    ``ready`` the backend's readiness; GPU memory is exported when NVML sees a GPU."""

    def __init__(
        self,
        models: Callable[[], Iterable[Any]] | None = None,
        *,
        ready: Callable[[], bool] | None = None,
        gpu: Collector | None = None,
        shared_dir: str | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.shared_dir = shared_dir
        self._models = models
        self._ready = ready
        self._gpu = gpu if gpu is not None else GpuMemoryCollector()
        self.statistics = InferenceStatistics()
        """The same events as Triton's statistics extension reports them (this process's)."""
        self.requests = Counter(
            f"{_PREFIX}_requests",
            "Inference requests answered, by status code (HTTP status or gRPC code name).",
            ["model", "version", "protocol", "code"],
            registry=self.registry,
        )
        self.request_duration = Histogram(
            f"{_PREFIX}_request_duration_seconds",
            "Time from receiving an inference request to answering it.",
            ["model", "version", "protocol"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            f"{_PREFIX}_queue_wait_seconds",
            "Time a request waited in the batching queue.",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.compute = Histogram(
            f"{_PREFIX}_compute_seconds",
            "Time one batch took to compute.",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            f"{_PREFIX}_batch_size",
            "Rows per executed batch.",
            ["model", "version"],
            buckets=_ROW_BUCKETS,
            registry=self.registry,
        )
        # labelled children, looked up once per label set (``labels()`` takes a lock and
        # builds a key on every call; answers and batches are counted on the hot path)
        self._request_children: dict[tuple[str, str, str, str | int], tuple[Any, Any]] = {}
        self._batch_children: dict[str, tuple[Any, Any, Any]] = {}
        if shared_dir is not None:
            self._shared_gauges = _SharedGauges(self.registry)
        else:
            if models is not None:
                self.registry.register(_ModelGauges(models))
            if ready is not None:
                self.registry.register(_Readiness(ready))
            self.registry.register(self._gpu)

    def observe_request(
        self, *, model: str, version: str, protocol: str, code: str | int, seconds: float
    ) -> None:
        """Count one answered request (every answer, errors included)."""
        key = (model, version, protocol, code)
        children = self._request_children.get(key)
        if children is None:
            children = (
                self.requests.labels(model, version, protocol, str(code)),
                self.request_duration.labels(model, version, protocol),
            )
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)
        if version:  # a request for no served model belongs to no model's statistics
            self.statistics.observe_request(model, version, code in (200, "OK"), seconds)

    def on_batch(self, record: BatchRecord) -> None:
        """BatchExecutor's ``on_batch`` hook."""
        children = self._batch_children.get(record.name)
        if children is None:
            model, version = _split_name(record.name)
            children = (
                self.batch_size.labels(model, version),
                self.compute.labels(model, version),
                self.queue_wait.labels(model, version),
            )
            self._batch_children[record.name] = children
        size, compute, wait = children
        size.observe(record.size_rows)
        compute.observe(record.compute_s)
        for seconds in record.queue_wait_s:
            wait.observe(seconds)
        self.statistics.observe_batch(*_split_name(record.name), record)

    def refresh(self) -> None:
        """Write this worker's gauges to the shared files (multi-worker mode only)."""
        if self.shared_dir is None:
            return
        models = list(self._models()) if self._models is not None else []
        self._shared_gauges.update(models, bool(self._ready()) if self._ready else False)

    def render(self) -> bytes:
        """The registry in Prometheus text format; with workers, every worker's together."""
        if self.shared_dir is None:
            return generate_latest(self.registry)
        from prometheus_client import multiprocess

        self.refresh()
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=self.shared_dir)
        registry.register(self._gpu)  # one machine: any worker sees the same GPUs
        return generate_latest(registry)


class _SharedGauges:
    """The scrape-time gauges as multiprocess gauges, one value per worker process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._gauges = [
            (
                Gauge(
                    f"{_PREFIX}_{name}",
                    doc,
                    ["model", "version"],
                    registry=registry,
                    multiprocess_mode=mode,  # type: ignore[arg-type]
                ),
                value,
                mode == "livesum",
            )
            for name, doc, value, mode in _MODEL_GAUGES
        ]
        self.ready = Gauge(
            f"{_PREFIX}_ready", _READY_HELP, registry=registry, multiprocess_mode="livemin"
        )
        self._seen: set[tuple[str, str]] = set()

    def update(self, models: list[Any], ready: bool) -> None:
        current = set()
        for m in models:
            key = (str(m.name), str(m.version))
            current.add(key)
            for gauge, value, _ in self._gauges:
                got = value(m)
                if got is not None:
                    gauge.labels(*key).set(float(got))
        for key in self._seen - current:
            # An unloaded version drops out of the sums. The multiprocess files cannot forget
            # a series, so it stays listed, at 0, until the worker restarts.
            for gauge, _, summed in self._gauges:
                if summed:
                    gauge.labels(*key).set(0.0)
        self._seen |= current
        self.ready.set(1.0 if ready else 0.0)
