"""Locating the highest open-loop rate a configuration sustains within its SLO.

The open-loop grid of ``batching.py`` is coarse (heavy: fractions of (a)), so the rate a
config really sustains can lie anywhere between a grid point that met the SLO and the next one
that missed it. ``RateSearch`` narrows that bracket with a bounded number of probes: it starts
from the closed-loop maximum (the most the config served with a full queue), grows
geometrically while probes pass and shrinks geometrically while they fail until both ends are
known, then bisects. It is pure (no clock, no I/O): the caller measures each rate it asks for
and reports whether it was sustained, so the modes of one protocol can take turns probe by
probe, exactly as the grid does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RateSearch"]


@dataclass
class RateSearch:
    """Bracket search over offered rates (req/s).

    ``lo``: highest rate known to be sustained (None: none yet); ``hi``: lowest rate known to
    miss above ``lo`` (None: none yet). ``next_rate()`` returns the next rate to measure, or
    None once ``max_probes`` are spent or the bracket is within ``tolerance`` (relative).
    """

    start_rps: float
    max_probes: int = 6
    tolerance: float = 0.05
    grow: float = 1.5
    min_rps: float = 1.0
    lo: float | None = None
    hi: float | None = None
    probes: list[tuple[float, bool]] = field(default_factory=list)

    def seed(self, rate: float, sustained: bool) -> None:
        """Take a point already measured (a grid rate) into the bracket, costing no probe."""
        self._narrow(rate, sustained)

    def record(self, rate: float, sustained: bool) -> None:
        """The outcome of a probe this search asked for."""
        self.probes.append((rate, sustained))
        self._narrow(rate, sustained)

    def _narrow(self, rate: float, sustained: bool) -> None:
        if sustained:
            if self.lo is None or rate > self.lo:
                self.lo = rate
            if self.hi is not None and self.hi <= rate:
                # A noisy miss below a pass: trust the higher pass, forget the stale miss.
                self.hi = None
        elif (self.hi is None or rate < self.hi) and (self.lo is None or rate > self.lo):
            self.hi = rate

    @property
    def done(self) -> bool:
        if len(self.probes) >= self.max_probes:
            return True
        if self.lo is not None and self.hi is not None:
            return self.hi <= self.lo * (1 + self.tolerance)
        return self.hi is not None and self.hi <= self.min_rps

    def next_rate(self) -> float | None:
        if self.done:
            return None
        lo, hi = self.lo, self.hi
        start = max(self.start_rps, self.min_rps)
        if not self.probes and (lo is None or start > lo) and (hi is None or start < hi):
            rate = start
        elif hi is None:
            rate = (lo if lo is not None else start) * self.grow
        elif lo is None:
            rate = max(hi / self.grow, self.min_rps)
        else:
            rate = (lo + hi) / 2
        return round(rate, 1)

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "start_rps": round(self.start_rps, 1),
            "max_probes": self.max_probes,
            "probes_used": len(self.probes),
            "sustained_rps": self.lo or 0.0,
            "missed_rps": self.hi,
        }
