"""The autoscaler's configuration types: frozen dataclasses with every default applied.

The gateway compiles them from a policy's validated ``autoscale:`` block
(gateway/autoscale_policy.py); the algorithms and clamps read them and never see user input.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AutoscaleConfig",
    "Limits",
    "PIDParams",
    "PanicConfig",
    "Params",
    "PredictiveParams",
    "ProportionalParams",
    "ThresholdParams",
]


@dataclass(frozen=True)
class Limits:
    """Clamps applied to every recommendation, whatever the algorithm (None: no step limit)."""

    min_replicas: int = 1
    max_replicas: int = 10
    max_step_up: int | None = None
    max_step_down: int | None = None
    cooldown_up_s: float = 0.0
    cooldown_down_s: float = 300.0
    stabilization_up_s: float = 0.0
    stabilization_down_s: float = 300.0


@dataclass(frozen=True)
class PanicConfig:
    """Knative-style panic: when the short window asks for ``threshold`` x the ready replicas,
    follow it at once (no up-stabilization) and refuse to scale down for ``hold_s``. It needs a
    per-replica target, so the threshold algorithm never panics."""

    enabled: bool = True
    threshold: float = 2.0
    window_s: float = 6.0
    hold_s: float = 60.0


@dataclass(frozen=True)
class ThresholdParams:
    """The issue's rule: above ``threshold`` add ``step`` instances; below
    ``scale_in_threshold`` (when set) remove ``step``."""

    threshold: float
    step: int = 1
    scale_in_threshold: float | None = None


@dataclass(frozen=True)
class ProportionalParams:
    """HPA's rule on a ``window_s`` mean: ``replicas = metric / target`` (per replica), held
    while within the tolerance of the current count (``tolerance_up`` above it,
    ``tolerance_down`` below); ``backlog_drain_s`` adds the replicas that would drain the queue
    in that many seconds (request-rate metric only). Once the p99 latency reaches
    ``latency_guard_s`` the up-tolerance no longer applies: the band is there to ignore noise,
    and near the SLO a late replica costs more than an early one."""

    target: float
    tolerance_up: float = 0.1
    tolerance_down: float = 0.1
    latency_guard_s: float | None = None
    window_s: float = 0.0
    backlog_drain_s: float | None = None


@dataclass(frozen=True)
class PIDParams:
    """A PID loop on ``metric / (ready * target) - 1``; ``smoothing`` is the EWMA weight of a
    new output (1: none), ``integral_limit`` bounds the integral (anti-windup), errors within
    ``deadband`` count as 0."""

    target: float
    kp: float = 0.8
    ki: float = 0.01
    kd: float = 0.0
    smoothing: float = 0.5
    integral_limit: float = 10.0
    deadband: float = 0.1
    window_s: float = 0.0


@dataclass(frozen=True)
class PredictiveParams:
    """Holt-Winters on ``bucket_s`` means of the metric, pre-scaling for the peak of the next
    ``horizon_s``; reactive (``reactive``) whenever its recent error exceeds ``max_error``."""

    reactive: ProportionalParams
    horizon_s: float = 300.0
    bucket_s: float = 60.0
    season_s: float | None = 86400.0
    alpha: float = 0.3
    beta: float = 0.02
    gamma: float = 0.3
    phi: float = 0.95
    max_error: float = 0.2
    error_window: int = 30
    headroom: float = 1.0


Params = ThresholdParams | ProportionalParams | PIDParams | PredictiveParams


@dataclass(frozen=True)
class AutoscaleConfig:
    service: str
    algorithm: str
    metric: str
    sampling_interval_s: float
    limits: Limits
    panic: PanicConfig
    params: Params
    instance_type: str | None = None
