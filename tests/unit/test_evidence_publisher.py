"""The evidence publisher writes each Envoy's changed report once per round, many at a time
(bench/fleet_ingest.py: 1,000 Envoys written one after the other held an error burst back for
seconds), on the real ``file:`` store: every changed report lands, an unchanged one is not
written again."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as otlp
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from inferway.gateway.fleet.envoy_reports import EnvoyReports
from inferway.gateway.fleet.file_store import FileStore
from inferway.gateway.fleet.shared_evidence import PREFIX, EvidencePublisher, decode_report


def _export(requests: int) -> otlp.ExportMetricsServiceRequest:
    request = otlp.ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "cluster.upstream_rq_completed"
    metric.sum.data_points.add(
        attributes=[KeyValue(key="envoy.cluster_name", value=AnyValue(string_value="v2"))],
        as_int=requests,
    )
    return request


async def test_every_changed_report_is_written_and_an_unchanged_one_is_not(tmp_path: Path) -> None:
    clock = iter(range(1000, 10**6))
    reports = EnvoyReports(clock=lambda: float(next(clock)))
    for i in range(40):
        reports.record(f"envoy-{i:02d}", "zone-a", _export(i))
    store = FileStore(tmp_path / "store")
    publisher = EvidencePublisher(reports, store, 2.0, concurrency=8)

    assert await publisher.publish_once() == 40
    stored = {r.key.removeprefix(PREFIX): r for r in await store.list(PREFIX)}
    assert len(stored) == 40
    assert decode_report("envoy-07", stored["envoy-07"].value).totals["v2"].requests == 7

    assert await publisher.publish_once() == 0
    reports.record("envoy-07", "zone-a", _export(70))
    assert await publisher.publish_once() == 1
    record = await store.get(PREFIX + "envoy-07")
    assert record is not None
    assert decode_report("envoy-07", record.value).totals["v2"].requests == 70
