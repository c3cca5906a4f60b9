"""Tracing through Envoy: the HTTP connection manager's OpenTelemetry tracer and the collector
cluster it exports to.

Envoy starts (or continues) the trace at the listener, propagates W3C ``traceparent`` to the
backend and exports its spans over OTLP/gRPC. The exporter needs a cluster that speaks HTTP/2;
it is a translator-owned cluster (``inferway_otel_collector``, a name no policy service can
take: the policy check reserves the ``inferway_`` prefix) with its endpoint inlined, so it
exists in CDS whenever tracing is on. Envoy batches spans (5 s by default); the runtime keys in
:data:`FAST_FLUSH_RUNTIME` make it export each span within ~100 ms (tests and the demo).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import grpc_service_pb2
from inferway._xds_protos.envoy.config.trace.v3 import http_tracer_pb2, opentelemetry_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.type.metadata.v3 import metadata_pb2
from inferway._xds_protos.envoy.type.tracing.v3 import custom_tag_pb2
from inferway._xds_protos.envoy.type.v3 import percent_pb2
from inferway.resolve.ir.observability import TracingIR
from inferway.xds.translate._protos import duration, pack
from inferway.xds.translate.inline_cluster import build_inline_http2_cluster
from inferway.xds.translate.picker_envoy import PREFIX_HASH_HEADER
from inferway.xds.translate.picker_score import NAMESPACE as PICK_NAMESPACE

__all__ = [
    "COLLECTOR_CLUSTER",
    "FAST_FLUSH_RUNTIME",
    "OPENTELEMETRY_TRACER",
    "REQUEST_ID_TAG",
    "build_collector_cluster",
    "build_layered_runtime",
    "build_tracing",
]

COLLECTOR_CLUSTER = "inferway_otel_collector"
OPENTELEMETRY_TRACER = "envoy.tracers.opentelemetry"
REQUEST_ID_TAG = "request_id"
"""Span tag holding x-request-id (the backend's request span uses the same attribute key)."""
PREFIX_HASH_TAG = "inferway.picker.prefix_hash"
"""``picker: {process: envoy}``: the prompt prefix's hash the request was balanced on (set only
on such requests); with Envoy's ``upstream_address`` it says where the request went and why."""
PICK_TAGS = ("winner", "reason")
"""``picker: {process: envoy, pick: score}``: the pick's winner and reason, from the request's
``inferway.picker`` dynamic metadata, as span tags ``inferway.picker.winner`` / ``.reason``."""

FAST_FLUSH_RUNTIME: dict[str, int] = {
    "tracing.opentelemetry.flush_interval_ms": 100,
    "tracing.opentelemetry.min_flush_spans": 1,
}
"""Envoy runtime (bootstrap static layer) that exports spans at once instead of every 5 s."""


def build_layered_runtime(runtime: Mapping[str, Any]) -> dict[str, Any]:
    """A bootstrap ``layered_runtime``: ``runtime`` as a static layer, then an admin layer
    (so ``/runtime_modify`` still works). Set it as ``bootstrap["layered_runtime"]``."""
    return {
        "layers": [
            {"name": "inferway_static", "static_layer": dict(runtime)},
            {"name": "admin", "admin_layer": {}},
        ]
    }


def build_tracing(tracing: TracingIR) -> hcm_pb2.HttpConnectionManager.Tracing:
    """HCM tracing: OpenTelemetry over gRPC to the collector cluster, ``sampling_percent`` of
    new requests sampled, the request id as a span tag (and the prompt prefix's hash, on
    requests a ``process: envoy`` picker balanced; the winner and reason of a ``pick: score``
    picker's pick)."""
    config = opentelemetry_pb2.OpenTelemetryConfig(
        grpc_service=grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=COLLECTOR_CLUSTER),
            timeout=duration(tracing.timeout),
        ),
        service_name=tracing.service_name,
    )
    return hcm_pb2.HttpConnectionManager.Tracing(
        provider=http_tracer_pb2.Tracing.Http(name=OPENTELEMETRY_TRACER, typed_config=pack(config)),
        random_sampling=percent_pb2.Percent(value=tracing.sampling_percent),
        custom_tags=[
            custom_tag_pb2.CustomTag(
                tag=REQUEST_ID_TAG,
                request_header=custom_tag_pb2.CustomTag.Header(name="x-request-id"),
            ),
            custom_tag_pb2.CustomTag(
                tag=PREFIX_HASH_TAG,
                request_header=custom_tag_pb2.CustomTag.Header(name=PREFIX_HASH_HEADER),
            ),
            *(_pick_tag(key) for key in PICK_TAGS),
        ],
    )


def _pick_tag(key: str) -> custom_tag_pb2.CustomTag:
    return custom_tag_pb2.CustomTag(
        tag=f"{PICK_NAMESPACE}.{key}",
        metadata=custom_tag_pb2.CustomTag.Metadata(
            kind=metadata_pb2.MetadataKind(request=metadata_pb2.MetadataKind.Request()),
            metadata_key=metadata_pb2.MetadataKey(
                key=PICK_NAMESPACE, path=[metadata_pb2.MetadataKey.PathSegment(key=key)]
            ),
        ),
    )


def build_collector_cluster(tracing: TracingIR) -> cluster_pb2.Cluster:
    """The OTLP/gRPC collector as an HTTP/2 cluster with its one endpoint inlined."""
    return build_inline_http2_cluster(
        COLLECTOR_CLUSTER,
        tracing.collector_host,
        tracing.collector_port,
        tracing.collector_connect_timeout,
    )
