"""Envoy's OpenTelemetry stat sink, read as the per-cluster totals the rollout analysis uses.

Every Envoy of the fleet pushes its stats to the control plane (``envoy.stat_sinks.
open_telemetry``, OTLP over the xDS gRPC connection's cluster), so the control plane needs no
inbound access to any Envoy's admin. With Envoy's defaults (tag-extracted names, tags as
attributes, cumulative counters and histograms) a cluster's ``cluster.upstream_rq_completed``,
``cluster.upstream_rq_xx`` (by ``envoy.response_code_class``) and ``cluster.upstream_rq_time``
(ms buckets) carry ``envoy.cluster_name``; so do the gauges ``cluster.upstream_rq_active`` and
``cluster.membership_healthy`` (the autoscaler's in-flight count and healthy hosts). A route's
local rate limiter (``http_local_rate_limit.enabled`` / ``.rate_limited``, tagged
``envoy.local_http_ratelimit_prefix`` with the route's stat prefix) is read by
:func:`limiter_totals_from_export` (a fleet-wide limit's shares follow each Envoy's offered
load). Pure: an export request in, totals out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from inferway.gateway.rollouts.envoy_stats import ClusterTotals

__all__ = ["CLUSTER", "LIMITER", "limiter_totals_from_export", "totals_from_export"]

CLUSTER = "envoy.cluster_name"
LIMITER = "envoy.local_http_ratelimit_prefix"
_COMPLETED = "cluster.upstream_rq_completed"
_BY_CLASS = "cluster.upstream_rq_xx"
_TIME = "cluster.upstream_rq_time"
_ACTIVE = "cluster.upstream_rq_active"
_HEALTHY = "cluster.membership_healthy"
_GAUGES = (_ACTIVE, _HEALTHY)
_LIMITED = {"http_local_rate_limit.enabled": 0, "http_local_rate_limit.rate_limited": 1}


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in pairs}


def totals_from_export(
    request: ExportMetricsServiceRequest, clusters: Iterable[str] | None = None
) -> dict[str, ClusterTotals]:
    """Each cluster's running totals in one export (all clusters when ``clusters`` is None;
    a wanted cluster the export does not mention has zero totals)."""
    wanted = None if clusters is None else set(clusters)
    completed: dict[str, int] = {}
    classes: dict[str, dict[str, int]] = {}
    buckets: dict[str, dict[float, int]] = {}
    gauges: dict[str, dict[str, int]] = {}
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name not in (_COMPLETED, _BY_CLASS, _TIME, *_GAUGES):
                    continue
                kind = metric.WhichOneof("data")
                if kind == "gauge" and metric.name in _GAUGES:
                    for point in metric.gauge.data_points:
                        cluster = _attributes(point.attributes).get(CLUSTER, "")
                        if wanted is None or cluster in wanted:
                            value = int(point.as_int or point.as_double)
                            gauges.setdefault(cluster, {})[metric.name] = value
                elif kind == "sum":
                    for point in metric.sum.data_points:
                        labels = _attributes(point.attributes)
                        cluster = labels.get(CLUSTER, "")
                        if wanted is not None and cluster not in wanted:
                            continue
                        value = int(point.as_int or point.as_double)
                        if metric.name == _COMPLETED:
                            completed[cluster] = value
                        else:
                            code = labels.get("envoy.response_code_class", "")
                            classes.setdefault(cluster, {})[code] = value
                elif kind == "histogram" and metric.name == _TIME:
                    for hist in metric.histogram.data_points:
                        cluster = _attributes(hist.attributes).get(CLUSTER, "")
                        if wanted is not None and cluster not in wanted:
                            continue
                        bounds = [*hist.explicit_bounds, math.inf]
                        running = 0
                        cumulative: dict[float, int] = {}
                        for bound, count in zip(bounds, hist.bucket_counts, strict=False):
                            running += count
                            cumulative[bound] = running
                        buckets[cluster] = cumulative
    names = set(completed) | set(classes) | set(buckets) | set(gauges) if wanted is None else wanted
    totals: dict[str, ClusterTotals] = {}
    for cluster in names:
        by_class = classes.get(cluster, {})
        requests = completed.get(cluster, sum(by_class.values()))
        errors = min(by_class.get("5", 0), requests)
        gauge = gauges.get(cluster, {})
        totals[cluster] = ClusterTotals(
            requests,
            errors,
            buckets.get(cluster, {}),
            active=gauge.get(_ACTIVE, 0),
            healthy=gauge.get(_HEALTHY),
        )
    return totals


def limiter_totals_from_export(request: ExportMetricsServiceRequest) -> dict[str, tuple[int, int]]:
    """Each local rate limiter's running ``(offered, refused)`` in one export, by stat prefix
    (a route's name): ``enabled`` counts every request the route's bucket saw, ``rate_limited``
    the ones it refused."""
    found: dict[str, list[int]] = {}
    for resource in request.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                slot = _LIMITED.get(metric.name)
                if slot is None or metric.WhichOneof("data") != "sum":
                    continue
                for point in metric.sum.data_points:
                    prefix = _attributes(point.attributes).get(LIMITER)
                    if prefix:
                        found.setdefault(prefix, [0, 0])[slot] = int(
                            point.as_int or point.as_double
                        )
    return {prefix: (offered, refused) for prefix, (offered, refused) in found.items()}
