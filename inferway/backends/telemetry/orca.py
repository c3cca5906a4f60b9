"""ORCA load reports (``endpoint-load-metrics``) so Envoy can weight this backend by its load.

Envoy's ``client_side_weighted_round_robin`` sets weight = rps_fractional / utilization and
rejects a report whose rps is not positive ("QPS must be positive"), so rps is floored at a
small positive value even when idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "ORCA_HEADER",
    "LoadReport",
    "LoadReporter",
    "build_orca_header",
    "parse_orca_header",
    "resolve_load_report",
]

ORCA_HEADER = "endpoint-load-metrics"
MIN_RPS = 0.001


class _Executor(Protocol):
    queue_depth: int

    def utilization(self) -> float: ...

    def rps(self) -> float: ...


@dataclass(frozen=True)
class LoadReport:
    """The backend's load right now, summed over every served model."""

    rps: float
    utilization: float
    queue_depth: int


def resolve_load_report(executors: Iterable[_Executor]) -> LoadReport:
    """Aggregate the executors' load: rps and queue depth add up; utilization adds up too
    (models share this host's compute) and is clamped to 1."""
    rps = 0.0
    util = 0.0
    depth = 0
    for ex in executors:
        rps += max(0.0, float(ex.rps()))
        util += max(0.0, float(ex.utilization()))
        depth += int(ex.queue_depth)
    return LoadReport(rps=rps, utilization=min(1.0, util), queue_depth=depth)


def build_orca_header(report: LoadReport) -> str:
    """The header value in Envoy's TEXT form: ``TEXT k=v, k=v``."""
    rps = max(report.rps, MIN_RPS)
    util = min(1.0, max(0.0, report.utilization))
    return (
        f"TEXT rps_fractional={rps:.6g}, application_utilization={util:.6g}, "
        f"named_metrics.queue_depth={int(report.queue_depth)}"
    )


def parse_orca_header(value: str) -> dict[str, float]:
    """Parse a TEXT report back into ``{key: value}`` (used by tests and the gateway's status)."""
    prefix = "TEXT "
    if not value.startswith(prefix):
        raise ValueError(f"ORCA header must start with 'TEXT ', got {value!r}")
    out: dict[str, float] = {}
    for part in value[len(prefix) :].split(","):
        part = part.strip()
        if not part:
            continue
        sep = "=" if "=" in part else ":"
        key, _, raw = part.partition(sep)
        out[key.strip()] = float(raw.strip())
    return out


class LoadReporter:
    """The header value one server stamps on its answers, recomputed at most every
    ``max_age_s`` while the backend is busy.

    Envoy recomputes weights from reports about once a second, so a report a few tens of
    milliseconds old is as good as a fresh one, and under load it saves summing every model's
    load on every answer. An idle report is never reused: the first answers after a quiet
    spell show their rate at once.
    """

    def __init__(
        self,
        models: Callable[[], Iterable[Any]],
        *,
        max_age_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._models = models
        self._max_age_s = max_age_s
        self._clock = clock
        self._value = ""
        self._expires = float("-inf")

    def header(self) -> str:
        now = self._clock()
        if now < self._expires:
            return self._value
        report = resolve_load_report(m.executor for m in self._models())
        self._value = build_orca_header(report)
        self._expires = now + self._max_age_s if report.rps > 0 else float("-inf")
        return self._value
