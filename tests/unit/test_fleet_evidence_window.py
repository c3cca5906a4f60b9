"""The fleet's rollout evidence, pure: OTLP exports read as cluster totals, and windows summed
over nodes (each node differenced on its own, a restarted node counted from zero, a silent
node named and left out)."""

from __future__ import annotations

import math

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)

from inferway.gateway.fleet.envoy_reports import EnvoyReports, FleetStatsSource, NewestReports
from inferway.gateway.fleet.otlp_totals import totals_from_export
from inferway.gateway.rollouts.envoy_stats import ScrapeError


def _attrs(cluster: str, code_class: str | None = None) -> list[KeyValue]:
    labels = {"envoy.cluster_name": cluster}
    if code_class is not None:
        labels["envoy.response_code_class"] = code_class
    return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in labels.items()]


def _export(counts: dict[str, tuple[int, int]]) -> ExportMetricsServiceRequest:
    """cluster -> (completed, 5xx), with a latency histogram of all requests under 5 ms."""
    metrics = []
    for cluster, (completed, errors) in counts.items():
        metrics.append(
            Metric(
                name="cluster.upstream_rq_completed",
                sum=Sum(
                    data_points=[NumberDataPoint(as_int=completed, attributes=_attrs(cluster))]
                ),
            )
        )
        metrics.append(
            Metric(
                name="cluster.upstream_rq_xx",
                sum=Sum(
                    data_points=[
                        NumberDataPoint(
                            as_int=completed - errors,
                            attributes=_attrs(cluster, "2"),
                        ),
                        NumberDataPoint(
                            as_int=errors,
                            attributes=_attrs(cluster, "5"),
                        ),
                    ]
                ),
            )
        )
        metrics.append(
            Metric(
                name="cluster.upstream_rq_time",
                histogram=Histogram(
                    data_points=[
                        HistogramDataPoint(
                            count=completed,
                            explicit_bounds=[1.0, 5.0],
                            bucket_counts=[0, completed, 0],
                            attributes=_attrs(cluster),
                        )
                    ]
                ),
            )
        )
    return ExportMetricsServiceRequest(
        resource_metrics=[ResourceMetrics(scope_metrics=[ScopeMetrics(metrics=metrics)])]
    )  # fmt: skip


def test_an_export_reads_as_each_clusters_running_totals() -> None:
    totals = totals_from_export(_export({"stable": (90, 0), "canary": (10, 2)}))
    assert totals["canary"].requests == 10 and totals["canary"].errors == 2
    assert totals["stable"].buckets == {1.0: 0, 5.0: 90, math.inf: 90}
    assert totals_from_export(_export({}), ["stable"])["stable"].requests == 0


async def test_a_window_sums_every_nodes_own_difference_and_names_the_silent() -> None:
    now = [0.0]
    reports = EnvoyReports(clock=lambda: now[0])
    source = FleetStatsSource(reports, "stable", "canary", silent_after_s=5, clock=lambda: now[0])
    with pytest.raises(ScrapeError, match="no Envoy has reported"):
        await source.sample()
    reports.record("a", "zone-a", _export({"stable": (100, 0), "canary": (10, 1)}))
    reports.record("b", "zone-b", _export({"stable": (50, 0), "canary": (5, 0)}))
    assert await source.sample() is None

    now[0] = 2
    reports.record("a", "zone-a", _export({"stable": (150, 0), "canary": (20, 3)}))
    reports.record("b", "zone-b", _export({"stable": (7, 0), "canary": (1, 1)}))  # b restarted
    window = await source.sample()
    assert window is not None and source.last_window is not None
    assert (window.stable.requests, window.canary.requests, window.canary.errors) == (57, 11, 3)
    assert source.last_window.by_node["b"].stable.requests == 7

    now[0] = 9  # a stays quiet past silent_after_s, b keeps reporting
    reports.record("b", "zone-b", _export({"stable": (17, 0), "canary": (2, 1)}))
    window = await source.sample()
    assert window is not None and source.last_window.silent == ("a",)
    assert (window.stable.requests, window.canary.requests) == (10, 1)

    now[0] = 20
    with pytest.raises(ScrapeError, match="every Envoy is silent"):
        await source.sample()


async def test_an_envoy_gone_past_the_evidence_ttl_stops_counting_and_is_flagged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    reports = EnvoyReports(clock=lambda: now[0], expire_after_s=30)
    source = FleetStatsSource(reports, "stable", "canary", silent_after_s=5, clock=lambda: now[0])
    reports.record("a", "zone-a", _export({"stable": (100, 0), "canary": (10, 1)}))
    reports.record("b", "zone-b", _export({"stable": (50, 0), "canary": (5, 0)}))
    assert await source.sample() is None

    now[0] = 20  # a silent: left out of the window, still known
    reports.record("b", "zone-b", _export({"stable": (60, 0), "canary": (6, 0)}))
    await source.sample()
    assert source.last_window is not None
    assert (source.last_window.silent, source.last_window.gone) == (("a",), ())

    now[0] = 31  # a past the TTL: gone, neither counted nor silent; logged once
    reports.record("b", "zone-b", _export({"stable": (70, 0), "canary": (7, 0)}))
    with caplog.at_level("WARNING", logger="inferway.fleet"):
        window = await source.sample()
        await source.sample()
    assert window is not None and window.stable.requests == 10
    assert (source.last_window.silent, source.last_window.gone) == ((), ("a",))
    assert source.last_window.to_json()["gone"] == ["a"]
    assert sorted(reports.reports()) == ["b"] and sorted(reports.expired()) == ["a"]
    assert sum("Envoy a (zone 'zone-a') has not reported" in r.message for r in caplog.records) == 1

    reports.record("a", "zone-a", _export({"stable": (110, 0), "canary": (11, 1)}))  # it is back
    assert sorted(reports.reports()) == ["a", "b"] and not reports.expired()

    now[0] = 31 + 10 * 30 + 1  # gone for ten TTLs: forgotten
    assert not reports.reports() and not reports.expired()
    with pytest.raises(ScrapeError, match="no Envoy has reported"):
        await source.sample()
    with pytest.raises(ValueError, match="positive"):
        EnvoyReports(expire_after_s=0)


async def test_the_leader_reads_each_nodes_newest_report_of_its_own_and_the_stores() -> None:
    now = [0.0]
    local = EnvoyReports(clock=lambda: now[0])  # this replica's receiver
    stored = EnvoyReports(clock=lambda: now[0])  # stands for the store's copy of every replica's
    stored.record("a", "zone-a", _export({"stable": (100, 0), "canary": (10, 0)}))
    stored.record("b", "zone-b", _export({"stable": (40, 0), "canary": (4, 0)}))
    local.record("a", "zone-a", _export({"stable": (100, 0), "canary": (10, 0)}))
    source = FleetStatsSource(
        NewestReports(stored, local), "stable", "canary", silent_after_s=5, clock=lambda: now[0]
    )
    assert await source.sample() is None

    now[0] = 1  # a's burst is in this replica's receiver; the store has not got it yet
    local.record("a", "zone-a", _export({"stable": (110, 0), "canary": (60, 50)}))
    window = await source.sample()
    assert window is not None
    assert (window.canary.requests, window.canary.errors) == (50, 50)

    now[0] = 2  # the store catches up with an older copy of a: nothing is counted twice
    stored.record("a", "zone-a", _export({"stable": (110, 0), "canary": (60, 50)}))
    stored.record("b", "zone-b", _export({"stable": (50, 0), "canary": (5, 0)}))
    window = await source.sample()
    assert window is not None
    assert (window.stable.requests, window.canary.requests, window.canary.errors) == (10, 1, 0)

    now[0] = 100  # past the TTL in both views: gone; a node live in one view is not gone
    views = NewestReports(stored, local)
    assert sorted(views.expired()) == ["a", "b"] and not views.reports()
    local.record("a", "zone-a", _export({"stable": (120, 0), "canary": (61, 50)}))
    assert sorted(views.expired()) == ["b"] and sorted(views.reports()) == ["a"]
