"""IR of a service's traffic settings: load balancing, health checks, outlier detection and
circuit breakers, every default already applied (None means "off" or "Envoy's own")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "CircuitBreakersIR",
    "FailurePercentageIR",
    "HealthCheckIR",
    "LoadAwareIR",
    "LoadBalancingIR",
    "OutlierDetectionIR",
    "RetryBudgetIR",
    "SuccessRateIR",
    "TcpKeepaliveIR",
]


@dataclass(frozen=True)
class LoadAwareIR:
    blackout_period: float
    weight_expiration_period: float
    weight_update_period: float
    error_utilization_penalty: float


@dataclass(frozen=True)
class LoadBalancingIR:
    policy: Literal["round_robin", "least_request", "random", "ring_hash", "maglev", "load_aware"]
    choice_count: int | None
    """least_request only."""
    load_aware: LoadAwareIR | None
    """load_aware only."""
    overprovisioning_factor: int
    panic_threshold: float
    locality_weighted: bool
    """True when any endpoint names a zone: traffic splits across zones first."""


@dataclass(frozen=True)
class TcpKeepaliveIR:
    """Whole seconds, as the socket options take them."""

    idle_s: int
    interval_s: int
    probes: int


@dataclass(frozen=True)
class HealthCheckIR:
    type: Literal["http", "grpc"]
    path: str
    grpc_service: str
    interval: float
    timeout: float
    no_traffic_interval: float
    unhealthy_interval: float | None
    """None: Envoy's default (``interval``)."""
    unhealthy_threshold: int
    healthy_threshold: int


@dataclass(frozen=True)
class SuccessRateIR:
    minimum_hosts: int
    request_volume: int
    stdev_factor: int


@dataclass(frozen=True)
class FailurePercentageIR:
    threshold: int
    minimum_hosts: int
    request_volume: int


@dataclass(frozen=True)
class OutlierDetectionIR:
    consecutive_5xx: int | None
    consecutive_gateway_errors: int | None
    success_rate: SuccessRateIR | None
    failure_percentage: FailurePercentageIR | None
    interval: float
    base_ejection_time: float
    max_ejection_time: float
    max_ejection_percent: int
    uneject_on_health_check: bool


@dataclass(frozen=True)
class RetryBudgetIR:
    percent: float
    min_concurrency: int


@dataclass(frozen=True)
class CircuitBreakersIR:
    """Unset limits (None) are Envoy's defaults."""

    max_connections: int | None
    max_pending_requests: int | None
    max_requests: int | None
    max_retries: int | None
    retry_budget: RetryBudgetIR | None
