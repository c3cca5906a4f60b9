"""What every model served on one event loop asks of a batch computed on that loop's thread.

A batch computed on the event loop's thread (``placement.py``) holds up the whole loop: the
timeouts of every model's queued requests, and the reading of every model's new ones. So the
rules that put a batch there ask all the models that share the loop: the earliest deadline of a
request queued for any of them, and how many requests per second the others are expected to
send meanwhile. ``app.py`` makes one per server and hands it to every model's executor; an
executor built without one sees only its own model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DeadlineSource", "ExpectedWait", "LoopMember", "SharedLoop"]

DeadlineSource = Callable[[], float | None]
"""A model's earliest queued deadline (``Scheduler.next_deadline``), None if none has one."""
ExpectedWait = Callable[[float], float]
"""Seconds from ``now`` until the model's next request is expected (``ArrivalRate.expected_wait``:
the mean gap, or the silence so far when longer, so a model whose traffic stopped stops
counting); ``math.inf`` while unknown."""


def _never(now: float) -> float:
    return math.inf


@dataclass(eq=False)
class LoopMember:
    """One model on the loop: its queued deadlines and its expected arrivals."""

    next_deadline: DeadlineSource
    expected_wait: ExpectedWait = _never


class SharedLoop:
    """The models served on one event loop (used on that loop's thread only)."""

    def __init__(self) -> None:
        self._members: list[LoopMember] = []

    def __len__(self) -> int:
        return len(self._members)

    def join(self, member: LoopMember) -> None:
        self._members.append(member)

    def leave(self, member: LoopMember) -> None:
        """Forget ``member`` (a stopped model); one that never joined is ignored."""
        if member in self._members:
            self._members.remove(member)

    def earliest_deadline(self) -> float | None:
        """The earliest deadline of any request still queued, across the models."""
        found = [d for d in (m.next_deadline() for m in self._members) if d is not None]
        return min(found, default=None)

    def others_rate(self, member: LoopMember, now: float) -> float:
        """Requests per second expected from the models other than ``member`` at ``now``
        (``math.inf`` if one expects its next request at once)."""
        rate = 0.0
        for other in self._members:
            if other is member:
                continue
            wait = other.expected_wait(now)
            if wait <= 0.0:
                return math.inf
            rate += 1.0 / wait  # an unknown (infinite) wait adds nothing
        return rate
