"""The autoscaler on a fleet, pure parts: its state survives a hand-over (a restored autoscaler
makes exactly the decisions the original would have), the fleet's load is the sum of every
Envoy's own difference, and the OTLP export carries the gauges and the limiters' counters."""

from __future__ import annotations

import json
import random

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Gauge,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)

from inferway.controllers.autoscale.autoscaler import Autoscaler
from inferway.controllers.autoscale.samples import MetricSample
from inferway.gateway.autoscale_inputs import StatsError, build_sample
from inferway.gateway.autoscale_policy import autoscale_config
from inferway.gateway.fleet.envoy_reports import NodeReport
from inferway.gateway.fleet.fleet_load import FleetLoadSource
from inferway.gateway.fleet.otlp_totals import limiter_totals_from_export, totals_from_export
from inferway.gateway.rollouts.envoy_stats import ClusterTotals

RULES = {
    "proportional": {"metric": "request_rate", "target": 10, "stabilization": 30},
    "pid": {"algorithm": "pid", "metric": "request_rate", "target": 10, "stabilization": 30},
    "predictive": {"algorithm": "predictive", "metric": "request_rate", "target": 10},
}


@pytest.mark.parametrize("algorithm", sorted(RULES))
def test_a_restored_autoscaler_decides_as_the_original_would_have(algorithm: str) -> None:
    rule = {"sampling_interval": 5, "min_replicas": 1, "max_replicas": 40, **RULES[algorithm]}
    config = autoscale_config("svc", rule)
    original = Autoscaler(config)
    rng = random.Random(7)
    current = 1
    for step in range(40):
        t = 5.0 * step
        original.observe(MetricSample(time=t, request_rate=rng.uniform(0, 200)))
        current = original.decide(t, current=current, ready=current).desired
    state = json.loads(json.dumps(original.export_state()))  # through the store's JSON
    restored = Autoscaler(config)
    restored.restore_state(state)
    assert restored.last_decision == original.last_decision
    for step in range(40, 60):
        t = 5.0 * step
        sample = MetricSample(time=t, request_rate=rng.uniform(0, 200))
        outcomes = []
        for scaler in (original, restored):
            scaler.observe(sample)
            outcomes.append(scaler.decide(t, current=current, ready=current))
        if algorithm != "predictive":  # its forecast relearns from the window only
            assert outcomes[0] == outcomes[1], step
        current = outcomes[0].desired


class _Reports:
    def __init__(self) -> None:
        self.latest: dict[str, NodeReport] = {}

    def reports(self) -> dict[str, NodeReport]:
        return dict(self.latest)

    def put(self, node: str, at: float, requests: int, active: int = 0) -> None:
        totals = {"model": ClusterTotals(requests, 0, {5.0: requests}, active=active, healthy=3)}
        self.latest[node] = NodeReport(node, "", at, totals)


def test_the_fleets_rate_is_every_envoys_own_difference_summed() -> None:
    now = [0.0]
    reports = _Reports()
    source = FleetLoadSource(reports, silent_after_s=5, clock=lambda: now[0])
    with pytest.raises(StatsError, match="no Envoy has reported"):
        source.load("model")
    reports.put("a", 0, 1000, active=2)
    reports.put("b", 0, 500, active=1)
    first = source.load("model")
    assert first.load.active == 3 and first.load.healthy == 3 and first.rate is None
    before = (0.0, first.load)

    now[0] = 10
    reports.put("a", 10, 1300, active=4)  # 30 req/s
    reports.put("b", 10, 50)  # restarted: 50 since
    second = source.load("model")
    sample = build_sample(10.0, second.load, before)
    assert sample.request_rate == pytest.approx(35.0)
    assert second.rate == pytest.approx(35.0)  # each node over its own reports' times
    assert second.contributors == {
        "a": {"requests": 300, "in_flight": 4},
        "b": {"requests": 50, "in_flight": 0},
    }
    # a new leader continues from the exported state: the next interval counts once
    exported = json.loads(json.dumps(source.export_state("model")))
    successor = FleetLoadSource(reports, silent_after_s=5, clock=lambda: now[0])
    successor.restore_state("model", exported)

    now[0] = 20
    reports.put("b", 20, 150)  # a went quiet: silent, named, adds nothing
    reports.put("c", 20, 9999)  # a newcomer's first report is its baseline
    for src in (source, successor):
        third = src.load("model")
        assert third.silent == ("a",)
        assert build_sample(20.0, third.load, (10.0, second.load)).request_rate == 10.0
        assert third.rate == pytest.approx(10.0)  # b's; c has no interval yet
    now[0] = 40
    with pytest.raises(StatsError, match="every Envoy is silent"):
        source.load("model")


def _point(value: int, **labels: str) -> NumberDataPoint:
    attrs = [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in labels.items()]
    return NumberDataPoint(as_int=value, attributes=attrs)


def test_the_export_carries_the_gauges_and_each_routes_limiter() -> None:
    cluster = {"envoy.cluster_name": "model"}
    limiter = {"envoy.local_http_ratelimit_prefix": "chat"}
    metrics = [
        Metric(name="cluster.upstream_rq_completed", sum=Sum(data_points=[_point(40, **cluster)])),
        Metric(name="cluster.upstream_rq_active", gauge=Gauge(data_points=[_point(7, **cluster)])),
        Metric(name="cluster.membership_healthy", gauge=Gauge(data_points=[_point(2, **cluster)])),
        Metric(name="http_local_rate_limit.enabled", sum=Sum(data_points=[_point(90, **limiter)])),
        Metric(
            name="http_local_rate_limit.rate_limited", sum=Sum(data_points=[_point(30, **limiter)])
        ),
    ]
    request = ExportMetricsServiceRequest(
        resource_metrics=[ResourceMetrics(scope_metrics=[ScopeMetrics(metrics=metrics)])]
    )
    totals = totals_from_export(request)["model"]
    assert (totals.requests, totals.active, totals.healthy) == (40, 7, 2)
    assert limiter_totals_from_export(request) == {"chat": (90, 30)}
