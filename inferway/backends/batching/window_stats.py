"""Sliding-window load statistics of one executor: requests done per second and busy fraction.

The ORCA load report reads both on every answer of every served model, so they must not walk
the window: running sums are updated when a batch is recorded and when old batches leave the
window, which makes ``rps`` O(1) and ``utilization`` O(instances) (amortized). Pure: every
time is passed in, on whatever clock the caller uses.
"""

from __future__ import annotations

from collections import deque

__all__ = ["WindowStats"]


class WindowStats:
    """Finished batches of the last ``window_s`` seconds over ``instances`` model instances.

    Semantics (what a brute-force walk over every batch would give): ``rps`` counts requests
    of batches that ended at or after ``now - window_s``; ``utilization`` sums the parts of
    busy intervals that lie inside the window, running batches included, over
    ``min(window_s, now - started_at) * instances``.
    """

    def __init__(self, instances: int, window_s: float, started_at: float) -> None:
        if instances < 1:
            raise ValueError(f"instances must be >= 1, got {instances}")
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.instances = instances
        self.window_s = window_s
        self.started_at = started_at
        # Per instance the busy intervals are disjoint and recorded in order, so only the
        # oldest kept interval of an instance can straddle the window's start.
        self._busy: list[deque[tuple[float, float]]] = [deque() for _ in range(instances)]
        self._busy_sum = [0.0] * instances
        self._running: dict[int, float] = {}
        self._done: deque[tuple[float, int]] = deque()
        self._done_sum = 0

    def restart(self, now: float) -> None:
        """Forget nothing, but measure spans from ``now`` (the executor started serving)."""
        self.started_at = now

    def begin(self, instance: int, now: float) -> None:
        """``instance`` started a batch at ``now``."""
        self._running[instance] = now

    def end(self, instance: int, requests: int, now: float) -> None:
        """``instance`` finished the batch it began, which served ``requests`` requests."""
        start = self._running.pop(instance, now)
        self._busy[instance].append((start, now))
        self._busy_sum[instance] += now - start
        self._done.append((now, requests))
        self._done_sum += requests

    @property
    def running(self) -> int:
        """Batches begun and not ended."""
        return len(self._running)

    def _prune(self, start: float) -> None:
        done = self._done
        while done and done[0][0] < start:
            self._done_sum -= done.popleft()[1]
        for i, busy in enumerate(self._busy):
            if busy and busy[0][1] <= start:
                total = self._busy_sum[i]
                while busy and busy[0][1] <= start:
                    s, e = busy.popleft()
                    total -= e - s
                # an emptied log restarts from an exact zero (no drift from the float sums)
                self._busy_sum[i] = total if busy else 0.0

    def rps(self, now: float) -> float:
        """Requests computed per second over the window (0 before any time has passed)."""
        self._prune(now - self.window_s)
        span = min(self.window_s, now - self.started_at)
        if span <= 0:
            return 0.0
        return self._done_sum / span

    def utilization(self, now: float) -> float:
        """Busy fraction of all instances over the window, in [0, 1]."""
        start = now - self.window_s
        self._prune(start)
        busy = 0.0
        for i, log in enumerate(self._busy):
            if log:
                busy += self._busy_sum[i]
                first = log[0][0]
                if first < start:
                    busy -= start - first
        for s in self._running.values():
            busy += now - (s if s > start else start)
        span = min(self.window_s, now - self.started_at)
        if span <= 0:
            return 1.0 if self._running else 0.0
        return min(max(busy / (span * self.instances), 0.0), 1.0)
