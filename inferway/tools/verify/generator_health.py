"""What the load generator itself did to the latencies it reports: its garbage collector's
pauses and its event loop's lateness, recorded inside the locust process (locust_run.py).

Every user in a locust process shares one gevent loop, so anything that holds that loop (a
full collection walking locust's heap, a burst of greenlets to run, a CPU the process was not
given) delays every request in flight, and locust counts the delay as the server's. Measured
at 1,000 users: full collections of 47-68 ms, 3-6 of them in 40 s, before the start-up heap
was frozen (docs/benchmarks-history.md). :func:`freeze_heap` takes what start-up (and later,
the spawned users) built out of the collector's sight; :class:`GeneratorHealth` records what is
left, so a report can say whether a slow p99 was the server's or the load generator's.

Only the standard library is imported at module level (gevent inside :meth:`watch_loop`):
importing this module must not patch anything.
"""

from __future__ import annotations

import gc
import time
from collections import defaultdict

__all__ = [
    "DEFERRED_FULL_THRESHOLD",
    "LAG_TICK_S",
    "GeneratorHealth",
    "defer_full_collections",
    "freeze_heap",
    "peak_rss_mb",
]

LAG_TICK_S = 0.005
"""The loop watcher sleeps this long at a time; how much later it wakes is the loop's lag."""


def freeze_heap(collect: bool = False) -> int:
    """Exclude every object alive now from later collections (after one collection first when
    ``collect``); returns how many objects are frozen in all."""
    if collect:
        gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


DEFERRED_FULL_THRESHOLD = 1_000_000
"""Generation-1 collections between two full ones while deferred: none within a bounded run."""


def defer_full_collections() -> tuple[int, int, int]:
    """Keep the collector's full (generation 2) collections out of a bounded run; returns the
    thresholds before. Young collections still reclaim what dies young; what survives two of
    them waits for the process's exit, and the run reports its peak memory
    (:func:`peak_rss_mb`). An A/B instrument, off by default: at 1,000 users the full
    collections left after freezing took 5-10 ms, and deferring them moved neither the p99
    nor the loop's lateness beyond run-to-run noise (docs/benchmarks-history.md)."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], DEFERRED_FULL_THRESHOLD)
    return before


def peak_rss_mb() -> float | None:
    """This process's peak resident memory in MB (None where the platform does not say)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


class GeneratorHealth:
    """Collector pauses per generation and loop lateness per second since ``started``
    (``time.time()``). :meth:`install` hooks the collector; :meth:`watch_loop` is run as a
    greenlet of its own for as long as the load runs."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.pauses: dict[int, list[float]] = defaultdict(list)  # generation -> ms
        self.lags: dict[int, list[float]] = defaultdict(list)  # second -> ms late
        self._collecting: float | None = None

    def install(self) -> None:
        gc.callbacks.append(self._on_collection)

    def uninstall(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._collecting = time.perf_counter()
        elif self._collecting is not None:
            elapsed_ms = (time.perf_counter() - self._collecting) * 1000.0
            self.pauses[int(info["generation"])].append(elapsed_ms)
            self._collecting = None

    def record_lag(self, late_ms: float, now: float | None = None) -> None:
        second = int((time.time() if now is None else now) - self.started)
        self.lags[second].append(max(0.0, late_ms))

    def watch_loop(self) -> None:
        """Sleep :data:`LAG_TICK_S` at a time, forever, recording how late each wake-up is."""
        import gevent

        while True:
            before = time.perf_counter()
            gevent.sleep(LAG_TICK_S)
            self.record_lag((time.perf_counter() - before - LAG_TICK_S) * 1000.0)

    def lag_max_ms(self, second: int) -> float | None:
        values = self.lags.get(second)
        return max(values) if values else None

    def all_lags(self) -> list[float]:
        return [late for values in self.lags.values() for late in values]

    def gc_summary(self) -> dict[str, dict[str, float]]:
        """Per generation: how many collections, the longest and the total ms."""
        return {
            str(generation): {"collections": len(ms), "max_ms": max(ms), "total_ms": sum(ms)}
            for generation, ms in sorted(self.pauses.items())
            if ms
        }
