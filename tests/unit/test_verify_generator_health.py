"""The load generator's own health record (generator_health.py): collector pauses per
generation, the loop's lateness per second, the frozen heap."""

from __future__ import annotations

import gc
import subprocess
import sys

from inferway.tools.verify.generator_health import (
    DEFERRED_FULL_THRESHOLD,
    LAG_TICK_S,
    GeneratorHealth,
    defer_full_collections,
    freeze_heap,
    peak_rss_mb,
)


def test_collections_are_recorded_per_generation_while_installed() -> None:
    health = GeneratorHealth(started=0.0)
    health.install()
    try:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    finally:
        health.uninstall()
    gc.collect(2)  # after uninstall: not counted
    summary = health.gc_summary()
    assert summary["0"]["collections"] >= 1
    assert summary["2"]["collections"] == 2
    full = summary["2"]
    assert 0.0 <= full["max_ms"] <= full["total_ms"]
    assert health._on_collection not in gc.callbacks


def test_lag_is_bucketed_by_second_since_start_and_never_negative() -> None:
    health = GeneratorHealth(started=100.0)
    health.record_lag(3.0, now=100.2)
    health.record_lag(-0.5, now=100.9)  # woke early: clock granularity, not negative lag
    health.record_lag(12.0, now=102.5)
    assert health.lag_max_ms(0) == 3.0
    assert health.lag_max_ms(1) is None
    assert health.lag_max_ms(2) == 12.0
    assert sorted(health.all_lags()) == [0.0, 3.0, 12.0]
    assert health.gc_summary() == {}


def test_the_loop_watcher_measures_a_blocked_gevent_loop() -> None:
    # In a process of its own: gevent's loop must not start inside the test runner.
    script = f"""
import time, gevent
from inferway.tools.verify.generator_health import GeneratorHealth
health = GeneratorHealth(time.time())
watcher = gevent.spawn(health.watch_loop)
gevent.sleep(0.05)
def hog():
    time.sleep(0.08)  # holds the loop: no greenlet runs meanwhile
gevent.spawn(hog).join()
gevent.sleep(0.02)
watcher.kill()
lags = health.all_lags()
assert len(lags) >= 5, lags
assert max(lags) >= 60.0, max(lags)
print("ok", round(max(lags)), {LAG_TICK_S!r})
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok")


def test_freeze_heap_hides_the_live_objects_from_the_collector() -> None:
    before = gc.get_freeze_count()
    alive: list[object] = []  # tracked by the collector until frozen
    assert any(obj is alive for obj in gc.get_objects())
    try:
        frozen = freeze_heap(collect=True)
        assert frozen >= before
        assert frozen > 1000  # the interpreter and the test runner's modules at least
        # A frozen object that dies leaves the permanent generation (another thread of the
        # runner may drop one at any moment), so the count can only have shrunk since.
        assert 0 < gc.get_freeze_count() <= frozen
        assert not any(obj is alive for obj in gc.get_objects())  # the collector no longer sees it
        fresh: list[object] = []
        assert any(obj is fresh for obj in gc.get_objects())  # made after: still collected
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def _collections_while_keeping(objects: int) -> dict[str, dict[str, float]]:
    """Collections seen while ``objects`` new lists are made and kept (promoted, so the
    collector's rule for a full collection comes due), and as many cycles dropped."""
    health = GeneratorHealth(started=0.0)
    health.install()
    kept: list[list[object]] = []
    try:
        for _ in range(objects):
            kept.append([])
            cycle: list[object] = []
            cycle.append(cycle)
    finally:
        health.uninstall()
    del kept
    return health.gc_summary()


def test_deferring_full_collections_keeps_the_young_ones() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(100, 2, 2)  # frequent collections of every generation
        control = _collections_while_keeping(400_000)
        assert control["2"]["collections"] >= 1  # the test can see a full collection
        assert defer_full_collections() == (100, 2, 2)
        assert gc.get_threshold() == (100, 2, DEFERRED_FULL_THRESHOLD)
        deferred = _collections_while_keeping(400_000)
        assert deferred["0"]["collections"] >= 100 and deferred["1"]["collections"] >= 10
        assert "2" not in deferred
    finally:
        gc.set_threshold(*before)


def test_peak_memory_is_reported_in_megabytes() -> None:
    peak = peak_rss_mb()
    assert peak is not None and 5.0 < peak < 100_000.0
