"""Counts the analysis reads: what one window brought, and what a rollout run accumulated.

Canary and stable are always counted over the same windows, so a comparison never mixes
a quiet night for one version with a busy day for the other. Latency is value -> count, which
holds raw samples (count 1) and histogram buckets (upper bound -> bucket count) alike.

LLM versions also carry time to first token and time per output token (ITL), both ms as
value -> count, from the gateway's ``gen_ai_server_*`` histograms of streamed answers.

Each version is counted twice when a rollout has ``backend-*`` checks: as the proxy saw it
(Envoy's cluster stats, or Prometheus) and as the backends themselves report it (their own
``/metrics``: time inside the server, its own error answers), each over the same windows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DISTRIBUTIONS",
    "Distribution",
    "Evidence",
    "MirrorCounts",
    "VersionCounts",
    "WindowSample",
]

_EMPTY: Mapping[str, Any] = {"requests": 0, "errors": 0, "latency_ms": []}


Distribution = Literal["latency_ms", "ttft_ms", "itl_ms"]
"""A VersionCounts field holding value (ms) -> count."""
DISTRIBUTIONS: tuple[Distribution, ...] = ("latency_ms", "ttft_ms", "itl_ms")


def _merge(into: dict[float, int], other: Mapping[float, int]) -> None:
    for value, count in other.items():
        into[value] = into.get(value, 0) + count


@dataclass(slots=True)
class VersionCounts:
    """Requests, 5xx-class errors and latencies (ms) of one version; for LLM routes also the
    time to first token and per output token of its streamed answers (ms)."""

    requests: int = 0
    errors: int = 0
    latency_ms: dict[float, int] = field(default_factory=dict)
    ttft_ms: dict[float, int] = field(default_factory=dict)
    itl_ms: dict[float, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.requests < 0 or not 0 <= self.errors <= self.requests:
            raise ValueError(
                f"counts need 0 <= errors <= requests, got {self.errors} of {self.requests}"
            )
        for name in DISTRIBUTIONS:
            if any(c < 0 for c in self.distribution(name).values()):
                raise ValueError(f"{name} counts must not be negative")

    def distribution(self, name: Distribution) -> dict[float, int]:
        """The value (ms) -> count of ``name``."""
        if name == "ttft_ms":
            return self.ttft_ms
        if name == "itl_ms":
            return self.itl_ms
        return self.latency_ms

    def plus(self, other: VersionCounts) -> VersionCounts:
        """A new count of both (neither is changed)."""
        total = VersionCounts(
            self.requests,
            self.errors,
            dict(self.latency_ms),
            dict(self.ttft_ms),
            dict(self.itl_ms),
        )
        total.add(other)
        return total

    def add(self, other: VersionCounts) -> None:
        self.requests += other.requests
        self.errors += other.errors
        for name in DISTRIBUTIONS:
            _merge(self.distribution(name), other.distribution(name))

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            **{
                name: [[v, c] for v, c in sorted(self.distribution(name).items())]
                for name in DISTRIBUTIONS
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VersionCounts:
        def read(name: str) -> dict[float, int]:
            # saved before LLM metrics existed: none measured
            return {float(v): int(c) for v, c in data.get(name, [])}

        return cls(
            requests=int(data["requests"]),
            errors=int(data["errors"]),
            latency_ms={float(v): int(c) for v, c in data["latency_ms"]},
            ttft_ms=read("ttft_ms"),
            itl_ms=read("itl_ms"),
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

    def plus(self, other: MirrorCounts) -> MirrorCounts:
        return MirrorCounts(self.compared + other.compared, self.disagreed + other.disagreed)

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
    """What a metric source measured over one window (deltas, not running totals).
    ``backend_*``: the same window as the backends' own metrics report it (empty unless the
    rollout has a ``backend-*`` check)."""

    stable: VersionCounts
    canary: VersionCounts
    mirror: MirrorCounts = field(default_factory=MirrorCounts)
    backend_stable: VersionCounts = field(default_factory=VersionCounts)
    backend_canary: VersionCounts = field(default_factory=VersionCounts)

    def plus(self, other: WindowSample) -> WindowSample:
        """Both windows as one (a window held back, then joined to the next)."""
        return WindowSample(
            self.stable.plus(other.stable),
            self.canary.plus(other.canary),
            self.mirror.plus(other.mirror),
            self.backend_stable.plus(other.backend_stable),
            self.backend_canary.plus(other.backend_canary),
        )


@dataclass(slots=True)
class Evidence:
    """Everything one rollout run has seen; reset by a restart. ``step_canary_requests``
    counts only the current step, for a ``min_requests`` floor."""

    stable: VersionCounts = field(default_factory=VersionCounts)
    canary: VersionCounts = field(default_factory=VersionCounts)
    mirror: MirrorCounts = field(default_factory=MirrorCounts)
    step_canary_requests: int = 0
    backend_stable: VersionCounts = field(default_factory=VersionCounts)
    backend_canary: VersionCounts = field(default_factory=VersionCounts)

    def add(self, sample: WindowSample) -> None:
        self.stable.add(sample.stable)
        self.canary.add(sample.canary)
        self.mirror.add(sample.mirror)
        self.backend_stable.add(sample.backend_stable)
        self.backend_canary.add(sample.backend_canary)
        self.step_canary_requests += sample.canary.requests

    def versions(self, *, backend: bool) -> tuple[VersionCounts, VersionCounts]:
        """(stable, canary) as the proxy counted them, or as the backends report them."""
        if backend:
            return self.backend_stable, self.backend_canary
        return self.stable, self.canary

    def to_json(self) -> dict[str, Any]:
        return {
            "stable": self.stable.to_json(),
            "canary": self.canary.to_json(),
            "mirror": self.mirror.to_json(),
            "step_canary_requests": self.step_canary_requests,
            "backend_stable": self.backend_stable.to_json(),
            "backend_canary": self.backend_canary.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Evidence:
        return cls(
            stable=VersionCounts.from_json(data["stable"]),
            canary=VersionCounts.from_json(data["canary"]),
            mirror=MirrorCounts.from_json(data["mirror"]),
            step_canary_requests=int(data["step_canary_requests"]),
            # saved before backend metrics existed: none counted
            backend_stable=VersionCounts.from_json(data.get("backend_stable", _EMPTY)),
            backend_canary=VersionCounts.from_json(data.get("backend_canary", _EMPTY)),
        )
