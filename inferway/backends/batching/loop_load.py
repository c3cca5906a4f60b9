"""How busy the serving event loop is: the share of wall time its thread ran or waited for a CPU.

The adaptive batcher asks it whether the loop (parsing, decoding, answering) limits throughput.
When it does, an idle model instance is not the scarce resource: every batch costs the loop
a dispatch and a settle, and on a CPU model the batch's compute takes cores from the loop, so
fewer, fuller batches serve more requests (see ``Scheduler``). A lone request, or a loop with
time to spare, still gets its batch at once.

The measure is Linux's per-thread scheduler statistics (``/proc/self/task/<tid>/schedstat``: time
on a CPU and time runnable but waiting for one, in nanoseconds). Waiting counts as busy: on a
core shared with the model's own threads the loop cannot run more than the core leaves it, and
it is still the loop that limits. Where schedstat is missing (another OS, a kernel without
schedstats) it falls back to the thread's CPU time, which undercounts on a shared core.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["LOOP_BUSY", "LoopLoad", "schedstat_reader", "this_threads_loop_load"]

LOOP_BUSY = 0.8
"""A loop at least this busy limits throughput: the batcher fills batches (Scheduler)."""
SAMPLE_EVERY_S = 0.1
"""The share is re-measured at most this often (one small file read)."""
_SMOOTHING = 0.5
"""Weight of the newest window in the running share (half-life about one window)."""

Reader = Callable[[], float]
"""Seconds the measured thread has been busy, since some fixed origin."""


def schedstat_reader(native_id: int | None = None) -> Reader:
    """A reader of the calling thread's busy seconds (or thread ``native_id``'s): on a CPU
    plus runnable-but-waiting, from schedstat; the thread's CPU time where that is missing."""
    tid = threading.get_native_id() if native_id is None else native_id
    path = Path(f"/proc/self/task/{tid}/schedstat")
    try:
        _parse(path.read_bytes())
    except (OSError, ValueError):
        if native_id is not None and native_id != threading.get_native_id():
            raise ValueError(f"no schedstat for thread {native_id}") from None
        return time.thread_time

    def read() -> float:
        return _parse(path.read_bytes())

    return read


def _parse(raw: bytes) -> float:
    on_cpu, waiting, _slices = raw.split()
    return (int(on_cpu) + int(waiting)) / 1e9


class LoopLoad:
    """The loop thread's busy share over the last few tenths of a second.

    Built on the loop thread (it measures the thread that creates it unless given ``reader``);
    ``share()`` is cheap: it reads the counter only once per ``every_s``."""

    def __init__(
        self,
        reader: Reader | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        every_s: float = SAMPLE_EVERY_S,
    ) -> None:
        self._read = reader if reader is not None else schedstat_reader()
        self._clock = clock
        self._every = every_s
        self._at = clock()
        self._busy = self._read()
        self._share = 0.0

    def share(self) -> float:
        """The loop's busy share in [0, 1], smoothed over the recent windows."""
        now = self._clock()
        elapsed = now - self._at
        if elapsed < self._every:
            return self._share
        busy = self._read()
        window = min(max((busy - self._busy) / elapsed, 0.0), 1.0)
        self._at, self._busy = now, busy
        self._share += _SMOOTHING * (window - self._share)
        return self._share


_per_thread = threading.local()


def this_threads_loop_load() -> LoopLoad:
    """The calling thread's meter, one per thread: every model's executor on a loop shares
    it, so the counter is read once per window however many models are served."""
    load: LoopLoad | None = getattr(_per_thread, "load", None)
    if load is None:
        load = _per_thread.load = LoopLoad()
    return load
