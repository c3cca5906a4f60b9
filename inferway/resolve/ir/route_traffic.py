"""IR of the per-route traffic tools: mirroring, fault injection and cookie matches.
Percentages are integers in parts of a million, the finest denominator Envoy takes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CookieMatchIR", "FaultAbortIR", "FaultDelayIR", "FaultIR", "MirrorIR"]


@dataclass(frozen=True)
class CookieMatchIR:
    """Exactly one of exact or present is set (as in the policy)."""

    name: str
    exact: str | None = None
    present: bool | None = None


@dataclass(frozen=True)
class MirrorIR:
    service: str
    per_million: int
    """Share of the route's requests copied to ``service``, in parts of a million."""


@dataclass(frozen=True)
class FaultAbortIR:
    per_million: int
    status: int


@dataclass(frozen=True)
class FaultDelayIR:
    per_million: int
    seconds: float


@dataclass(frozen=True)
class FaultIR:
    """At least one of abort or delay is set."""

    abort: FaultAbortIR | None
    delay: FaultDelayIR | None
