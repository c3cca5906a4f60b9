"""Circuit breakers: per-service limits on connections, pending requests, active requests
and retries, and the retry budget (which Envoy keeps with the circuit breakers).

Every service gets thresholds: Envoy's default of 3 concurrent retries per service
overflows as soon as a replica dies under load (``upstream_rq_retry_overflow``, the request
fails without a retry), so a service that sets neither ``max_retries`` nor ``retry_budget``
gets the default retry budget (resolve applies it). ``track_remaining`` is on so
``remaining_*`` gauges show how close a service is to its limits; overflow shows as
``upstream_cx_overflow`` / ``upstream_rq_pending_overflow`` / ``upstream_rq_retry_overflow``
counters."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.cluster.v3 import circuit_breaker_pb2
from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.type.v3 import percent_pb2
from inferway.resolve.ir.traffic import CircuitBreakersIR
from inferway.xds.translate._protos import uint32_value

__all__ = ["build_circuit_breakers"]


def build_circuit_breakers(limits: CircuitBreakersIR) -> circuit_breaker_pb2.CircuitBreakers:
    thresholds = circuit_breaker_pb2.CircuitBreakers.Thresholds(
        priority=base_pb2.RoutingPriority.DEFAULT, track_remaining=True
    )
    for field in ("max_connections", "max_pending_requests", "max_requests", "max_retries"):
        value = getattr(limits, field)
        if value is not None:
            getattr(thresholds, field).CopyFrom(uint32_value(value))
    budget = limits.retry_budget
    if budget is not None:
        thresholds.retry_budget.CopyFrom(
            circuit_breaker_pb2.CircuitBreakers.Thresholds.RetryBudget(
                budget_percent=percent_pb2.Percent(value=budget.percent),
                min_retry_concurrency=uint32_value(budget.min_concurrency),
            )
        )
    return circuit_breaker_pb2.CircuitBreakers(thresholds=[thresholds])
