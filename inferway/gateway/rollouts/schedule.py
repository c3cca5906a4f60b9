"""When a rollout's next analysis tick is due: a fixed schedule of the clock.

Sleeping one interval after each tick ends makes the windows drift by the time every scrape
and webhook takes; the schedule ``first + k * interval`` keeps them where they were planned.
"""

from __future__ import annotations

import math

__all__ = ["next_tick"]


def next_tick(due: float, now: float, interval: float) -> tuple[float, float]:
    """``(next due time, seconds to wait)`` after the tick due at ``due`` ended at ``now``:
    the next slot of the schedule ``due + k * interval`` after ``now``. A clock that went
    back by more than an interval (wall time is set) restarts the schedule from ``now``."""
    following = due + interval
    if following <= now:  # the tick overran: skip the slots it missed
        following += (math.floor((now - following) / interval) + 1) * interval
    if following - now > interval:
        following = now + interval
    return following, following - now
