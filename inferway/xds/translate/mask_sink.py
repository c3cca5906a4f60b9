"""Access logs through the gateway's mask sink: with a policy ``mask``, Envoy sends each
access log line as an OpenTelemetry log record (its body a key/value list with the same keys
and command operators as the JSON line, :data:`ACCESS_LOG_FIELDS`) to the sink, which masks
the values and writes the JSON line where the policy says. Envoy itself cannot rewrite a value
by pattern, so nothing it logs leaves it in clear."""

from __future__ import annotations

from opentelemetry.proto.common.v1 import common_pb2

from inferway._xds_protos.envoy.config.accesslog.v3 import accesslog_pb2
from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import (
    extension_pb2,
)
from inferway._xds_protos.envoy.extensions.access_loggers.open_telemetry.v3 import (
    logs_service_pb2,
)
from inferway._xds_protos.envoy.extensions.formatter.req_without_query.v3 import (
    req_without_query_pb2,
)
from inferway.resolve.ir.observability import AccessLogIR, MaskSinkIR
from inferway.xds.translate._protos import pack
from inferway.xds.translate.access_log import ACCESS_LOG_FIELDS
from inferway.xds.translate.grpc_access_log import grpc_log_common
from inferway.xds.translate.inline_cluster import build_inline_http2_cluster

__all__ = [
    "MASKED_LOG_NAME",
    "MASK_SINK_CLUSTER",
    "OPENTELEMETRY_ACCESS_LOGGER",
    "build_mask_sink_cluster",
    "build_masked_access_log",
]

MASK_SINK_CLUSTER = "inferway_mask_sink"
OPENTELEMETRY_ACCESS_LOGGER = "envoy.access_loggers.open_telemetry"
MASKED_LOG_NAME = "inferway_access_log"


def build_masked_access_log(access_log: AccessLogIR) -> accesslog_pb2.AccessLog:
    fields = {**{f.name: f.format for f in access_log.extra_fields}, **ACCESS_LOG_FIELDS}
    body = common_pb2.AnyValue(
        kvlist_value=common_pb2.KeyValueList(
            values=[
                common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=fields[key]))
                for key in sorted(fields)
            ]
        )
    )
    config = logs_service_pb2.OpenTelemetryAccessLogConfig(
        common_config=grpc_log_common(MASKED_LOG_NAME, MASK_SINK_CLUSTER),
        body=body,
        formatters=[
            extension_pb2.TypedExtensionConfig(
                name="envoy.formatter.req_without_query",
                typed_config=pack(req_without_query_pb2.ReqWithoutQuery()),
            )
        ],
    )
    return accesslog_pb2.AccessLog(name=OPENTELEMETRY_ACCESS_LOGGER, typed_config=pack(config))


def build_mask_sink_cluster(sink: MaskSinkIR) -> cluster_pb2.Cluster:
    return build_inline_http2_cluster(MASK_SINK_CLUSTER, sink.host, sink.port, 1.0)
