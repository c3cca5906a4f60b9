"""Counts the analysis reads: what one window brought, and what a rollout run accumulated.

Canary and stable are always counted over the same windows, so a comparison never mixes
a quiet night for one version with a busy day for the other. Latency is value -> count, which
holds raw samples (count 1) and histogram buckets (upper bound -> bucket count) alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Evidence", "MirrorCounts", "VersionCounts", "WindowSample"]


@dataclass(slots=True)
class VersionCounts:
    """Requests, 5xx-class errors and latencies (ms) of one version."""

    requests: int = 0
    errors: int = 0
    latency_ms: dict[float, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.requests < 0 or not 0 <= self.errors <= self.requests:
            raise ValueError(
                f"counts need 0 <= errors <= requests, got {self.errors} of {self.requests}"
            )
        if any(c < 0 for c in self.latency_ms.values()):
            raise ValueError("latency counts must not be negative")

    def add(self, other: VersionCounts) -> None:
        self.requests += other.requests
        self.errors += other.errors
        for value, count in other.latency_ms.items():
            self.latency_ms[value] = self.latency_ms.get(value, 0) + count

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "latency_ms": [[v, c] for v, c in sorted(self.latency_ms.items())],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VersionCounts:
        return cls(
            requests=int(data["requests"]),
            errors=int(data["errors"]),
            latency_ms={float(v): int(c) for v, c in data["latency_ms"]},
        )


@dataclass(slots=True)
class MirrorCounts:
    """Mirrored requests whose canary answer was compared with stable's, and how many
    disagreed beyond the tolerance."""

    compared: int = 0
    disagreed: int = 0

    def __post_init__(self) -> None:
        if self.compared < 0 or not 0 <= self.disagreed <= self.compared:
            raise ValueError(
                f"mirror counts need 0 <= disagreed <= compared, got "
                f"{self.disagreed} of {self.compared}"
            )

    def add(self, other: MirrorCounts) -> None:
        self.compared += other.compared
        self.disagreed += other.disagreed

    def to_json(self) -> dict[str, int]:
        return {"compared": self.compared, "disagreed": self.disagreed}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MirrorCounts:
        return cls(compared=int(data["compared"]), disagreed=int(data["disagreed"]))


@dataclass(frozen=True, slots=True)
class WindowSample:
    """What a metric source measured over one window (deltas, not running totals)."""

    stable: VersionCounts
    canary: VersionCounts
    mirror: MirrorCounts = field(default_factory=MirrorCounts)


@dataclass(slots=True)
class Evidence:
    """Everything one rollout run has seen; reset by a restart. ``step_canary_requests``
    counts only the current step, for a ``min_requests`` floor."""

    stable: VersionCounts = field(default_factory=VersionCounts)
    canary: VersionCounts = field(default_factory=VersionCounts)
    mirror: MirrorCounts = field(default_factory=MirrorCounts)
    step_canary_requests: int = 0

    def add(self, sample: WindowSample) -> None:
        self.stable.add(sample.stable)
        self.canary.add(sample.canary)
        self.mirror.add(sample.mirror)
        self.step_canary_requests += sample.canary.requests

    def to_json(self) -> dict[str, Any]:
        return {
            "stable": self.stable.to_json(),
            "canary": self.canary.to_json(),
            "mirror": self.mirror.to_json(),
            "step_canary_requests": self.step_canary_requests,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Evidence:
        return cls(
            stable=VersionCounts.from_json(data["stable"]),
            canary=VersionCounts.from_json(data["canary"]),
            mirror=MirrorCounts.from_json(data["mirror"]),
            step_canary_requests=int(data["step_canary_requests"]),
        )
