"""The IR's observability settings applied to Envoy: tracing and access logs on every HTTP
connection manager, plus the collector cluster tracing needs."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.resolve.ir.observability import ObservabilityIR
from inferway.xds.translate._protos import bool_value
from inferway.xds.translate.access_log import build_access_log
from inferway.xds.translate.mask_sink import build_mask_sink_cluster, build_masked_access_log
from inferway.xds.translate.tracing import build_collector_cluster, build_tracing

__all__ = ["apply_observability", "build_observability_clusters"]


def apply_observability(
    manager: hcm_pb2.HttpConnectionManager, observability: ObservabilityIR
) -> None:
    """Add tracing and the access logger to ``manager``; with either on, the request id is
    also returned to the client (x-request-id), so a caller can quote it."""
    if observability.tracing is not None:
        manager.tracing.CopyFrom(build_tracing(observability.tracing))
    access_log = observability.access_log
    if access_log is not None:
        manager.access_log.append(
            build_access_log(access_log)
            if access_log.mask_sink is None
            else build_masked_access_log(access_log)  # lines masked by the gateway first
        )
    if observability.tracing is not None or observability.access_log is not None:
        manager.always_set_request_id_in_response = True
        manager.generate_request_id.CopyFrom(bool_value(True))


def build_observability_clusters(observability: ObservabilityIR) -> list[cluster_pb2.Cluster]:
    """Clusters the observability settings need: the OTLP collector when tracing is on (the
    mask sink's address when masking), the mask sink when access logs go through it."""
    clusters = []
    if observability.tracing is not None:
        clusters.append(build_collector_cluster(observability.tracing))
    sink = None if observability.access_log is None else observability.access_log.mask_sink
    if sink is not None:
        clusters.append(build_mask_sink_cluster(sink))
    return clusters
