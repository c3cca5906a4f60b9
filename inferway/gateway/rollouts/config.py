"""A policy ``rollouts:`` entry as the pure controller's :class:`RolloutConfig`.

The policy speaks percent (``max_increase: 0.5%``); the controller speaks rates and parts of
10,000. The conversion lives here so neither side knows the other's units.
"""

from __future__ import annotations

from inferway.controllers.rollout.config import (
    AbsoluteGuard,
    AgreementCheck,
    AnalysisConfig,
    Check,
    ErrorRateCheck,
    LatencyCheck,
    MetricName,
    RolloutConfig,
    Step,
)
from inferway.policies.rollouts import Rollout

__all__ = ["build_rollout_config"]


def build_rollout_config(rollout: Rollout) -> RolloutConfig:
    """Raises RolloutConfigError for what the policy checks let through but the controller
    refuses (nothing today: the checks mirror the controller's)."""
    checks: list[Check] = []
    guards: list[AbsoluteGuard] = []
    for metric in rollout.analysis.metrics:
        name = MetricName(metric.name)
        if name in (MetricName.ERROR_RATE, MetricName.BACKEND_ERROR_RATE):
            assert metric.max_increase is not None  # RolloutMetric guarantees it
            checks.append(ErrorRateCheck(metric.max_increase / 100, name))
        elif name in (
            MetricName.LATENCY_P99,
            MetricName.BACKEND_LATENCY_P99,
            MetricName.TTFT,
            MetricName.ITL,
        ):
            assert metric.max_increase is not None
            checks.append(LatencyCheck(metric.max_increase / 100, name))
        elif name == MetricName.OUTPUT_AGREEMENT:
            assert metric.min is not None
            checks.append(AgreementCheck(metric.min / 100))
        elif name == MetricName.LATENCY_QUANTILE:
            assert metric.max_ms is not None
            guards.append(AbsoluteGuard("latency-quantile", metric.max_ms, metric.quantile))
        else:
            assert metric.max is not None
            guards.append(AbsoluteGuard("error-rate", metric.max / 100))
    return RolloutConfig(
        name=rollout.name,
        stable=rollout.stable,
        canary=rollout.canary,
        steps=tuple(Step(s.weight, s.pause) for s in rollout.steps),
        analysis=AnalysisConfig(
            interval_s=rollout.analysis.interval,
            checks=tuple(checks),
            guards=tuple(guards),
            min_requests=rollout.analysis.min_requests,
        ),
        on_failure=rollout.on_failure,
    )
