"""Which replicas of a ``process: envoy`` service Envoy should leave out for now: those the
model servers' own metrics show saturated (requests waiting + running at ``queue_limit``, or
KV cache at ``kv_cache_limit``), as the scoring picker skips them, decided once per scrape.

Envoy picks each request itself there (prefix hash, Maglev, bounded load on its own in-flight
counts); what it cannot see is the servers' queues and caches. The gateway scrapes those and
sends a saturated replica to Envoy as DEGRADED: Maglev's table is built over the healthy
replicas only, so that replica's prefixes move to the next replicas on the table until it
is taken back, and nothing else moves.

Rules (pure: the caller scrapes and passes the time):

* A replica is saturated on a scrape at or over either limit; it is taken back after
  ``hold_s`` of scrapes under both (a replica hovering at its limit does not flap the table
  on every scrape). A replica whose metrics are unknown (no metrics, down) is never left out
  for them: health checks and outlier detection are Envoy's for a replica that is down.
* A saturated replica goes out only while the pool has room for its traffic: the median
  replica still on the table (the lower median, of those with metrics) under ``room`` (half)
  of each limit. A pool loaded as a whole keeps every replica in: moving a queue around the
  pool would only cost the moved prefixes their cache (bench/picker_sim.py measured it), and
  Envoy's bounded load already evens its own traffic. What is left is what Envoy cannot see:
  one replica far deeper than its peers (other Envoys' traffic, long prompts, a slow card).
* At most ``max_share`` of the pool (half, rounded down) is out at once, the most loaded
  first: with every replica out Envoy would have no table at all.

Every change is recorded with its inputs (the scrape that decided it) and its reason.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import median_low

from inferway.gateway.picker.core.metrics import ServerMetrics

__all__ = ["SaturationChange", "SaturationGate", "SaturationLimits", "queue_depth"]

HISTORY = 64
"""Changes kept for status."""


@dataclass(frozen=True, slots=True)
class SaturationLimits:
    queue_limit: float = 8.0
    """Requests waiting + running at which a replica is saturated."""
    kv_cache_limit: float = 0.95
    """KV-cache use (0..1) at which a replica is saturated."""
    hold_s: float = 2.0
    """How long a saturated replica's scrapes must stay under both limits before it is
    taken back."""
    max_share: float = 0.5
    """At most this share of the pool (rounded down) is left out at once."""
    room: float = 0.5
    """A saturated replica goes out only while the pool's median replica is under this share
    of each limit."""


@dataclass(frozen=True, slots=True)
class SaturationChange:
    """A replica left out or taken back: when, why, and the scrape that decided it."""

    at: float
    endpoint: str
    left_out: bool
    reason: str
    depth: float | None
    kv_cache: float | None


@dataclass(slots=True)
class _Replica:
    metrics: ServerMetrics | None = None
    saturated: bool = False
    under_since: float | None = None
    """When its scrapes went under both limits (None: over, or never saturated)."""


def queue_depth(metrics: ServerMetrics | None) -> float | None:
    """Requests waiting plus running, as ``metrics`` show them (None: not known)."""
    if metrics is None or (metrics.waiting is None and metrics.running is None):
        return None
    return (metrics.waiting or 0.0) + (metrics.running or 0.0)


@dataclass
class SaturationGate:
    """One service's replicas and which of them Envoy leaves out now (``left_out``)."""

    limits: SaturationLimits = field(default_factory=SaturationLimits)
    history: deque[SaturationChange] = field(default_factory=lambda: deque(maxlen=HISTORY))
    _replicas: dict[str, _Replica] = field(default_factory=dict)
    _left_out: frozenset[str] = frozenset()
    _kept_in: int = 0
    _no_room: str | None = None

    def set_endpoints(self, endpoints: Iterable[str]) -> None:
        """The pool now: new replicas start in, removed ones are forgotten."""
        wanted = list(dict.fromkeys(endpoints))
        self._replicas = {e: self._replicas.get(e) or _Replica() for e in wanted}
        self._left_out = self._left_out & set(wanted)

    def endpoints(self) -> list[str]:
        return list(self._replicas)

    def _over(self, metrics: ServerMetrics | None) -> str | None:
        """Why ``metrics`` are at a limit (None: under both, or unknown)."""
        depth = queue_depth(metrics)
        limits = self.limits
        if depth is not None and depth >= limits.queue_limit:
            return f"queue {depth:g} >= queue_limit {limits.queue_limit:g}"
        used = None if metrics is None else metrics.kv_cache
        if used is not None and used >= limits.kv_cache_limit:
            return f"KV cache {used:.0%} >= kv_cache_limit {limits.kv_cache_limit:.0%}"
        return None

    def observe(self, endpoint: str, metrics: ServerMetrics | None, now: float) -> None:
        """One scrape of ``endpoint`` (None: it could not be read) at ``now``."""
        replica = self._replicas.get(endpoint)
        if replica is None:
            return
        replica.metrics = metrics
        if self._over(metrics) is not None:
            replica.saturated, replica.under_since = True, None
        elif replica.saturated:
            if replica.under_since is None:
                replica.under_since = now
            if now - replica.under_since >= self.limits.hold_s:
                replica.saturated, replica.under_since = False, None

    def decide(self, now: float) -> frozenset[str]:
        """After a round of scrapes: the replicas to leave out now, each change recorded."""
        saturated = [e for e, r in self._replicas.items() if r.saturated]
        room = self._room()
        self._no_room = room
        # out already and still saturated: stays (its hold); newly saturated: only with room
        movable = [e for e in saturated if e in self._left_out or room is None]
        cap = math.floor(len(self._replicas) * self.limits.max_share)

        def load(endpoint: str) -> tuple[float, float]:
            metrics = self._replicas[endpoint].metrics
            used = None if metrics is None else metrics.kv_cache
            return queue_depth(metrics) or 0.0, used or 0.0

        ranked = sorted(movable, key=lambda e: (*load(e), e), reverse=True)
        wanted = frozenset(ranked[:cap])
        for endpoint in sorted(wanted - self._left_out):
            why = self._over(self._replicas[endpoint].metrics) or "saturated"
            self._record(now, endpoint, True, f"{why}, the pool has room")
        for endpoint in sorted(self._left_out - wanted):
            replica = self._replicas.get(endpoint)
            if replica is None:
                continue
            if replica.saturated:
                why = (
                    f"still saturated, but at most {cap} of {len(self._replicas)} replicas "
                    "are left out: more loaded ones are"
                )
            else:
                why = f"under both limits for {self.limits.hold_s:g} s"
            self._record(now, endpoint, False, why)
        self._left_out = wanted
        self._kept_in = len(saturated) - len(wanted)
        return wanted

    def _room(self) -> str | None:
        """None when the pool has room for a saturated replica's traffic; else why not."""
        on_table = [r.metrics for e, r in self._replicas.items() if e not in self._left_out]
        depths = [d for m in on_table if (d := queue_depth(m)) is not None]
        used = [m.kv_cache for m in on_table if m is not None and m.kv_cache is not None]
        limits, share = self.limits, self.limits.room
        if depths and median_low(depths) >= limits.queue_limit * share:
            return (
                f"the pool's median queue {median_low(depths):g} >= {share:g} x "
                f"queue_limit {limits.queue_limit:g}"
            )
        if used and median_low(used) >= limits.kv_cache_limit * share:
            return (
                f"the pool's median KV cache {median_low(used):.0%} >= {share:g} x "
                f"kv_cache_limit {limits.kv_cache_limit:.0%}"
            )
        return None

    @property
    def left_out(self) -> frozenset[str]:
        return self._left_out

    @property
    def kept_in(self) -> int:
        """Saturated replicas kept in on the last decision (no room, or the cap)."""
        return self._kept_in

    @property
    def no_room(self) -> str | None:
        """Why the pool had no room on the last decision (None: it had)."""
        return self._no_room

    def _record(self, now: float, endpoint: str, left_out: bool, reason: str) -> None:
        metrics = self._replicas[endpoint].metrics
        kv = None if metrics is None else metrics.kv_cache
        self.history.append(
            SaturationChange(now, endpoint, left_out, reason, queue_depth(metrics), kv)
        )

    def metrics(self) -> dict[str, ServerMetrics | None]:
        """Each replica's last scrape (None: not read yet, or unreadable)."""
        return {e: r.metrics for e, r in self._replicas.items()}

    def stats(self) -> dict[str, dict[str, float | bool | None]]:
        """Per replica: the last scrape's queue depth, KV-cache use and the server's own
        prefix-cache hit rate (None: not said), saturated, left out."""
        return {
            e: {
                "depth": queue_depth(r.metrics),
                "kv_cache": None if r.metrics is None else r.metrics.kv_cache,
                "prefix_hit_rate": None if r.metrics is None else r.metrics.prefix_hit_rate,
                "saturated": r.saturated,
                "left_out": e in self._left_out,
            }
            for e, r in self._replicas.items()
        }
