"""The earliest deadline among the requests queued for every model that one event loop serves.

A batch computed on the event loop's thread (``placement.py``) holds up every timer of that
loop, the timeouts of other models' queued requests as much as its own model's, so the rule
that keeps such a batch off the loop when a deadline is near asks all of them. ``app.py`` makes
one per server and hands it to every model's executor; an executor built without one sees only
its own queue.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["DeadlineSource", "QueuedDeadlines"]

DeadlineSource = Callable[[], float | None]
"""A model's earliest queued deadline (``Scheduler.next_deadline``), None if none has one."""


class QueuedDeadlines:
    """The deadline sources of the models served on one event loop (used on that loop only)."""

    def __init__(self) -> None:
        self._sources: list[DeadlineSource] = []

    def __len__(self) -> int:
        return len(self._sources)

    def add(self, source: DeadlineSource) -> None:
        self._sources.append(source)

    def remove(self, source: DeadlineSource) -> None:
        """Forget ``source`` (a stopped model); one that was never added is ignored."""
        if source in self._sources:
            self._sources.remove(source)

    def earliest(self) -> float | None:
        """The earliest deadline of any request still queued, across the models."""
        found = [d for d in (source() for source in self._sources) if d is not None]
        return min(found, default=None)
