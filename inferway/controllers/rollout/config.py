"""A rollout's own settings, validated on construction.

The policy schema (a later change) builds these; the controller depends on nothing else, so it
stays pure and testable. Weights are parts of a constant total of 10,000: Envoy's
``use_hash_policy`` keeps a sticky cohort on the canary while it grows only if the total never
changes (issue 13), and 0.1% is exactly 10 parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from inferway.controllers.rollout.evidence import Distribution

__all__ = [
    "TOTAL_WEIGHT",
    "AbsoluteGuard",
    "AgreementCheck",
    "AnalysisConfig",
    "ErrorRateCheck",
    "LatencyCheck",
    "MetricName",
    "RolloutConfig",
    "RolloutConfigError",
    "Step",
    "percent_to_parts",
]

TOTAL_WEIGHT = 10_000


class MetricName(StrEnum):
    """A rollout metric as the policy names it (``analysis.metrics[].name``; a ``str``, so
    verdicts and saved state read the same). The policy schema keeps its own list
    (policies/rollouts.py, which may not import this layer); a test keeps the two equal."""

    ERROR_RATE = "error-rate"
    LATENCY_P99 = "latency-p99"
    BACKEND_ERROR_RATE = "backend-error-rate"
    BACKEND_LATENCY_P99 = "backend-latency-p99"
    OUTPUT_AGREEMENT = "output-agreement"
    LATENCY_QUANTILE = "latency-quantile"
    ERROR_RATE_MAX = "error-rate-max"
    TTFT = "ttft"
    ITL = "itl"


class RolloutConfigError(ValueError):
    """A rollout setting that cannot work; the message names the rollout and the field."""


def percent_to_parts(percent: float, *, where: str = "weight") -> int:
    """``percent`` (0.1 resolution) as parts of ``TOTAL_WEIGHT``; refuses finer values."""
    parts = percent * TOTAL_WEIGHT / 100.0
    rounded = round(parts)
    if abs(parts - rounded) > 1e-6 or rounded % 10:
        raise RolloutConfigError(f"{where}: {percent!r}% is finer than the 0.1% resolution")
    if not 0 < rounded <= TOTAL_WEIGHT:
        raise RolloutConfigError(f"{where}: {percent!r}% is outside (0, 100]")
    return rounded


@dataclass(frozen=True, slots=True)
class Step:
    """One weight the canary holds, for at least ``pause_s`` (and one analysis interval)."""

    percent: float
    pause_s: float = 0.0

    @property
    def parts(self) -> int:
        return percent_to_parts(self.percent)


@dataclass(frozen=True, slots=True)
class ErrorRateCheck:
    """Canary's error rate may exceed stable's (same window) by at most ``max_increase``
    (an absolute rate: 0.005 is 0.5 percentage points). ``backend-error-rate`` judges the
    backends' own answers (their ``/metrics``) instead of what the proxy counted."""

    max_increase: float
    name: Literal[MetricName.ERROR_RATE, MetricName.BACKEND_ERROR_RATE] = MetricName.ERROR_RATE

    @property
    def backend(self) -> bool:
        return self.name == MetricName.BACKEND_ERROR_RATE


@dataclass(frozen=True, slots=True)
class LatencyCheck:
    """Canary's latency may be at most ``max_increase`` (relative: 0.2 is +20%) above stable's.

    Tested on the whole distribution (Mann-Whitney U against stable scaled by
    ``1 + max_increase``), which for a scale shift is the same as its p99 moving by that
    factor, and far more powerful than comparing two noisy tail estimates.
    ``backend-latency-p99`` compares the time inside the backends (their request duration
    histogram), which the network and the proxy do not blur. ``ttft`` and ``itl`` run the
    same test on the time to first token and the time per output token of streamed LLM
    answers, as the gateway measures them."""

    max_increase: float
    name: Literal[
        MetricName.LATENCY_P99, MetricName.BACKEND_LATENCY_P99, MetricName.TTFT, MetricName.ITL
    ] = MetricName.LATENCY_P99

    @property
    def backend(self) -> bool:
        return self.name == MetricName.BACKEND_LATENCY_P99

    @property
    def distribution(self) -> Distribution:
        """Which of a version's distributions the check compares."""
        if self.name == MetricName.TTFT:
            return "ttft_ms"
        if self.name == MetricName.ITL:
            return "itl_ms"
        return "latency_ms"


@dataclass(frozen=True, slots=True)
class AgreementCheck:
    """For mirrored requests, the canary's answer matches stable's at least ``min`` of the
    time (0.99 is 99%)."""

    min: float
    name: Literal[MetricName.OUTPUT_AGREEMENT] = MetricName.OUTPUT_AGREEMENT


@dataclass(frozen=True, slots=True)
class AbsoluteGuard:
    """A hard limit on the canary alone, on top of the comparisons: ``latency-quantile``
    (``max`` in ms at ``quantile``) or ``error-rate`` (``max`` as a rate)."""

    metric: Literal["latency-quantile", "error-rate"]
    max: float
    quantile: float = 0.99


Check = ErrorRateCheck | LatencyCheck | AgreementCheck


@dataclass(frozen=True, slots=True)
class AnalysisConfig:
    """How verdicts are reached. ``alpha`` bounds the false-rollback probability of each
    comparison for the whole rollout with identical versions (exactly for a known stable
    rate; with stable's rate estimated the run-level rate is measured in the tests and
    bench/rollout_sim.py); ``beta`` the chance of passing a step with a canary exactly at the
    tolerated limit. ``min_requests`` is ``"auto"`` (what the
    test needs, computed) or a floor of canary requests per step."""

    interval_s: float = 30.0
    checks: tuple[Check, ...] = (ErrorRateCheck(0.005), LatencyCheck(0.2))
    guards: tuple[AbsoluteGuard, ...] = ()
    min_requests: int | Literal["auto"] = "auto"
    alpha: float = 0.001
    beta: float = 0.05


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    """One rollout: move weight from ``stable`` to ``canary`` through ``steps``."""

    name: str
    stable: str
    canary: str
    steps: tuple[Step, ...]
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)
    on_failure: Literal["rollback", "pause"] = "rollback"
    history_size: int = 100

    def __post_init__(self) -> None:
        where = f"rollout {self.name!r}"
        if not self.name:
            raise RolloutConfigError("rollout: name is empty")
        if not self.stable or not self.canary or self.stable == self.canary:
            raise RolloutConfigError(f"{where}: stable and canary must be two named backends")
        if not self.steps:
            raise RolloutConfigError(f"{where}: steps is empty")
        previous = 0
        for i, step in enumerate(self.steps):
            parts = percent_to_parts(step.percent, where=f"{where}: steps[{i}]")
            if parts <= previous:
                raise RolloutConfigError(
                    f"{where}: steps[{i}] = {step.percent}% does not increase on the step before"
                )
            if step.pause_s < 0:
                raise RolloutConfigError(f"{where}: steps[{i}].pause is negative")
            previous = parts
        self._check_analysis(where)
        if self.on_failure not in ("rollback", "pause"):
            raise RolloutConfigError(f"{where}: on_failure must be rollback or pause")
        if self.history_size < 1:
            raise RolloutConfigError(f"{where}: history_size must be at least 1")

    def _check_analysis(self, where: str) -> None:
        a = self.analysis
        if a.interval_s <= 0:
            raise RolloutConfigError(f"{where}: analysis.interval must be positive")
        if not 0 < a.alpha < 0.5 or not 0 < a.beta < 0.5:
            raise RolloutConfigError(f"{where}: analysis alpha and beta must be in (0, 0.5)")
        if a.min_requests != "auto" and (not isinstance(a.min_requests, int) or a.min_requests < 0):
            raise RolloutConfigError(f"{where}: analysis.min_requests must be auto or >= 0")
        names = [c.name for c in a.checks]
        if len(set(names)) != len(names):
            raise RolloutConfigError(f"{where}: analysis.metrics names a metric twice")
        for c in a.checks:
            if isinstance(c, ErrorRateCheck) and not 0 < c.max_increase < 1:
                raise RolloutConfigError(f"{where}: {c.name} max_increase must be in (0, 1)")
            if isinstance(c, LatencyCheck) and not c.max_increase > 0:
                raise RolloutConfigError(f"{where}: {c.name} max_increase must be positive")
            if isinstance(c, AgreementCheck) and not 0 < c.min < 1:
                raise RolloutConfigError(f"{where}: output-agreement min must be in (0, 1)")
        for g in a.guards:
            if g.max <= 0 or not 0 < g.quantile < 1:
                raise RolloutConfigError(f"{where}: guard {g.metric} needs max > 0, 0<quantile<1")

    @property
    def needs_backend_metrics(self) -> bool:
        """A check reads the backends' own metrics (the source must scrape them)."""
        return any(getattr(c, "backend", False) for c in self.analysis.checks)

    @property
    def needs_llm_metrics(self) -> bool:
        """A check reads the gateway's time-to-first-token or per-token histograms."""
        return any(c.name in (MetricName.TTFT, MetricName.ITL) for c in self.analysis.checks)

    @property
    def step_parts(self) -> tuple[int, ...]:
        return tuple(s.parts for s in self.steps)
