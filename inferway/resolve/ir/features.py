"""IR of feature routing: what a route requires of the request body (rows, size, JSON
fields) and where the feature router that measures it listens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FeatureRouterIR", "FeaturesIR", "FieldMatchIR", "RangeIR"]


@dataclass(frozen=True)
class RangeIR:
    """Inclusive bounds; None: unbounded on that side."""

    min: float | None
    max: float | None


@dataclass(frozen=True)
class FieldMatchIR:
    """Exactly one of exact, regex, present or range is set (as in the policy)."""

    path: str
    exact: bool | int | float | str | None = None
    regex: str | None = None
    present: bool | None = None
    range: RangeIR | None = None


@dataclass(frozen=True)
class FeaturesIR:
    rows: RangeIR | None
    input_bytes: RangeIR | None
    fields: tuple[FieldMatchIR, ...]
    on_malformed: Literal["skip", "reject"]

    @property
    def needs_inference_request(self) -> bool:
        """True when the body must be an inference request (rows), not just JSON."""
        return self.rows is not None


@dataclass(frozen=True)
class FeatureRouterIR:
    """The external processor Envoy asks before routing a listener with feature routes."""

    host: str
    port: int
    timeout: float
    """Seconds Envoy waits for an answer; then it routes without features."""
    fields: tuple[str, ...]
    """Every JSON field path a route matches on, sorted: what the router extracts."""
