"""LoopLoad: the event loop thread's busy share, from an injected counter and clock."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from inferway.backends.batching.loop_load import LoopLoad, schedstat_reader


class Counter:
    def __init__(self) -> None:
        self.busy = 0.0
        self.now = 0.0

    def read(self) -> float:
        return self.busy

    def clock(self) -> float:
        return self.now


def test_share_is_the_smoothed_busy_fraction_of_each_window():
    c = Counter()
    load = LoopLoad(c.read, clock=c.clock, every_s=0.125)
    assert load.share() == 0.0
    c.now, c.busy = 0.125, 0.125  # a fully busy window
    assert load.share() == pytest.approx(0.5)
    c.now, c.busy = 0.25, 0.25
    assert load.share() == pytest.approx(0.75)
    c.now, c.busy = 0.375, 0.25  # an idle one
    assert load.share() == pytest.approx(0.375)


def test_share_is_measured_at_most_once_a_window_and_stays_in_range():
    c = Counter()
    load = LoopLoad(c.read, clock=c.clock, every_s=0.125)
    c.now, c.busy = 0.0625, 5.0  # too soon: the previous share stands
    assert load.share() == 0.0
    c.now = 0.125  # more busy seconds than wall seconds (counters sampled apart): at most 1
    assert load.share() == pytest.approx(0.5)
    c.now, c.busy = 0.25, 4.0  # a counter going backwards counts as idle
    assert load.share() == pytest.approx(0.25)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="schedstat is Linux's")
def test_the_real_reader_counts_a_busy_thread():
    read = schedstat_reader()
    before, started = read(), time.perf_counter()
    while time.perf_counter() - started < 0.05:
        pass
    busy = read() - before
    assert 0.03 < busy < 1.0  # ran (or waited for a CPU) for about the 50 ms it spun


def test_another_thread_without_schedstat_is_an_error():
    with pytest.raises(ValueError, match="no schedstat"):
        schedstat_reader(native_id=2**30)


def test_the_reader_measures_the_thread_that_built_it():
    box: dict[str, float] = {}

    def idle_thread() -> None:
        read = schedstat_reader()
        before = read()
        time.sleep(0.05)
        box["busy"] = read() - before

    thread = threading.Thread(target=idle_thread)
    thread.start()
    started = time.perf_counter()
    while time.perf_counter() - started < 0.05:  # this thread is busy meanwhile
        pass
    thread.join()
    assert box["busy"] < 0.02


def test_one_meter_per_thread_shared_by_its_callers():
    from inferway.backends.batching.loop_load import this_threads_loop_load

    mine = this_threads_loop_load()
    assert this_threads_loop_load() is mine
    other: list[LoopLoad] = []
    thread = threading.Thread(target=lambda: other.append(this_threads_loop_load()))
    thread.start()
    thread.join()
    assert other[0] is not mine
