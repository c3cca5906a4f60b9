"""The piece every discrete-event simulation of the batching scheduler shares: at one instant,
start every batch the scheduler dispatches to the idle instances, as the executor does
(``next_action`` until it stops dispatching), and say when to wake next."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

from inferway.backends.batching import Dispatch, Scheduler, WaitUntil

__all__ = ["Running", "start_batches"]

Running = list[tuple[float, int, Dispatch[Any]]]
"""Batches in flight: a heap of (done at, tie-break, batch)."""
_ORDER = itertools.count()


def start_batches(
    s: Scheduler[Any], now: float, idle: int, running: Running, cost: Callable[[int], float]
) -> tuple[list[Dispatch[Any]], float]:
    """The batches started at ``now`` (each pushed on ``running``, done ``cost(rows)`` later;
    at most ``idle``) and the scheduler's next wake-up (inf: none asked)."""
    started: list[Dispatch[Any]] = []
    while True:
        action = s.next_action(now, idle - len(started))
        if isinstance(action, Dispatch):
            started.append(action)
            heapq.heappush(running, (now + cost(action.rows), next(_ORDER), action))
            continue
        if isinstance(action, WaitUntil):
            assert action.at > now
            return started, action.at
        return started, math.inf
