"""A scaling decision as a record: its inputs, the raw recommendation, each clamp, a reason.

``status`` shows it and logs carry it as a structured event; ``to_dict`` is plain JSON (no
infinities or NaNs), so nobody has to guess why a service has the replicas it has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Clamp", "Decision", "Recommendation", "whole_replicas"]


@dataclass(frozen=True)
class Clamp:
    """One limit that changed the replica count on the way from recommendation to decision."""

    name: str
    before: int
    after: int
    detail: str


@dataclass(frozen=True)
class Recommendation:
    """What an algorithm asks for before any clamp: fractional replicas (None: no data, hold),
    the inputs it read, algorithm-specific detail (PID terms, forecast) and a short reason.

    ``settled``: the algorithm vouches that no more than ``replicas`` are needed for its whole
    horizon (an accurate forecast agrees with the present), so a scale-in skips the
    down-stabilization window, which exists only because the future is otherwise unknown.

    ``tolerance``: the up-band of the algorithm (0: none). A count ``n`` is enough while
    ``replicas <= n * (1 + tolerance)``, so the whole count asked for is the smallest such
    ``n``, not the ceiling: 3.004 replicas' worth of load at a 10% band is 3 replicas, not 4."""

    replicas: float | None
    inputs: dict[str, float | None]
    reason: str
    detail: dict[str, Any] = field(default_factory=dict)
    settled: bool = False
    tolerance: float = 0.0


@dataclass(frozen=True)
class Decision:
    service: str
    time: float
    algorithm: str
    metric: str
    current: int
    ready: int
    inputs: dict[str, float | None]
    raw: float | None
    recommended: int
    desired: int
    clamps: tuple[Clamp, ...] = ()
    panic: bool = False
    detail: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    @property
    def direction(self) -> str:
        if self.desired > self.current:
            return "up"
        return "down" if self.desired < self.current else "hold"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = _json_safe(asdict(self))
        data["direction"] = self.direction
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        """The decision ``to_dict`` wrote (a new leader shows and continues from it)."""
        fields = {k: v for k, v in data.items() if k not in ("direction", "clamps")}
        clamps = tuple(Clamp(**c) for c in data.get("clamps", ()))
        return cls(**fields, clamps=clamps)


def whole_replicas(replicas: float, tolerance: float = 0.0) -> int:
    """The fewest whole replicas that carry ``replicas`` worth of load within the up-band
    ``tolerance`` (``n * (1 + tolerance) >= replicas``); never below 0."""
    return max(0, math.ceil(replicas / (1.0 + tolerance) - 1e-9))


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value
