"""A service's traffic settings with every default applied: what each policy field left out
(``None`` or a missing section) means, decided here and nowhere else."""

from __future__ import annotations

import math
from collections.abc import Sequence

from inferway.policies.model import Endpoint, Service
from inferway.policies.traffic import (
    CircuitBreakers,
    HealthCheck,
    LoadBalancing,
    OutlierDetection,
    RetryBudget,
    TcpKeepalive,
)
from inferway.resolve.ir.traffic import (
    CircuitBreakersIR,
    FailurePercentageIR,
    HealthCheckIR,
    LoadAwareIR,
    LoadBalancingIR,
    OutlierDetectionIR,
    RetryBudgetIR,
    SuccessRateIR,
    TcpKeepaliveIR,
)

__all__ = [
    "resolve_circuit_breakers",
    "resolve_health_check",
    "resolve_load_balancing",
    "resolve_outlier_detection",
    "resolve_tcp_keepalive",
]


def resolve_load_balancing(service: Service, endpoints: Sequence[Endpoint]) -> LoadBalancingIR:
    """Round robin with Envoy's overprovisioning factor (140) and a 50% panic threshold
    unless configured; zones (on any endpoint, from any source) turn on locality weighting."""
    lb = service.load_balancing or LoadBalancing()
    settings = lb.load_aware
    return LoadBalancingIR(
        policy=lb.policy,
        choice_count=lb.choice_count if lb.policy == "least_request" else None,
        load_aware=(
            LoadAwareIR(
                blackout_period=settings.blackout_period,
                weight_expiration_period=settings.weight_expiration_period,
                weight_update_period=settings.weight_update_period,
                error_utilization_penalty=settings.error_utilization_penalty,
            )
            if lb.policy == "load_aware"
            else None
        ),
        overprovisioning_factor=lb.overprovisioning_factor,
        panic_threshold=lb.panic_threshold,
        locality_weighted=any(e.zone is not None for e in endpoints),
    )


def resolve_health_check(
    protocol: str, configured: HealthCheck | None, default_path: str | None = None
) -> HealthCheckIR | None:
    """The configured check, else the readiness probe for HTTP/1 services (at
    ``default_path`` when given: an OpenAI-compatible engine's ``/v1/models``), else none;
    ``enabled: false`` gives none. Intervals are always explicit: Envoy's
    ``no_traffic_interval`` defaults to 60 s (ENVOY_NOTES)."""
    if configured is None:
        default = HealthCheck() if default_path is None else HealthCheck(path=default_path)
        check = default if protocol == "http1" else None
    else:
        check = configured if configured.enabled else None
    if check is None:
        return None
    return HealthCheckIR(
        type=check.type,
        path=check.path,
        grpc_service=check.grpc_service,
        interval=check.interval,
        timeout=check.probe_timeout,
        no_traffic_interval=check.idle_interval,
        unhealthy_interval=check.unhealthy_interval,
        unhealthy_threshold=check.unhealthy_threshold,
        healthy_threshold=check.healthy_threshold,
    )


def resolve_outlier_detection(configured: OutlierDetection | None) -> OutlierDetectionIR | None:
    """On with defaults unless configured; ``enabled: false`` gives none."""
    config = configured or OutlierDetection()
    if not config.enabled:
        return None
    rate, failure = config.success_rate, config.failure_percentage
    return OutlierDetectionIR(
        consecutive_5xx=config.consecutive_5xx,
        consecutive_gateway_errors=config.consecutive_gateway_errors,
        success_rate=(
            None
            if rate is None
            else SuccessRateIR(
                minimum_hosts=rate.minimum_hosts,
                request_volume=rate.request_volume,
                stdev_factor=rate.stdev_factor,
            )
        ),
        failure_percentage=(
            None
            if failure is None
            else FailurePercentageIR(
                threshold=round(failure.threshold),
                minimum_hosts=failure.minimum_hosts,
                request_volume=failure.request_volume,
            )
        ),
        interval=config.interval,
        base_ejection_time=config.base_ejection_time,
        max_ejection_time=config.max_ejection_time,
        max_ejection_percent=round(config.max_ejection_percent),
        uneject_on_health_check=config.uneject_on_health_check,
    )


def resolve_circuit_breakers(configured: CircuitBreakers | None) -> CircuitBreakersIR:
    """Unset limits stay Envoy's, except retries: without ``max_retries`` or
    ``retry_budget`` a service gets the default retry budget (Envoy's 3 concurrent retries
    overflow as soon as a replica dies under load)."""
    limits = configured or CircuitBreakers()
    budget = limits.retry_budget
    if budget is None and limits.max_retries is None:
        budget = RetryBudget()
    return CircuitBreakersIR(
        max_connections=limits.max_connections,
        max_pending_requests=limits.max_pending_requests,
        max_requests=limits.max_requests,
        max_retries=limits.max_retries,
        retry_budget=(
            None
            if budget is None
            else RetryBudgetIR(percent=budget.percent, min_concurrency=budget.min_concurrency)
        ),
    )


def resolve_tcp_keepalive(configured: TcpKeepalive) -> TcpKeepaliveIR | None:
    """On unless ``enabled: false``; durations rounded up to whole seconds (the kernel's
    unit), so 1.5 s never becomes a shorter 1 s."""
    if not configured.enabled:
        return None
    return TcpKeepaliveIR(
        idle_s=math.ceil(configured.idle),
        interval_s=math.ceil(configured.interval),
        probes=configured.probes,
    )
