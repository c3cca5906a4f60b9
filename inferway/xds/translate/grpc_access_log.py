"""The part every gRPC access log inferway configures shares: which log, sent to which of
inferway's own clusters, over the v3 API (the picker's end-of-request log, the LLM
processor's log of abandoned requests, the masked log's OpenTelemetry sink)."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.core.v3 import config_source_pb2, grpc_service_pb2
from inferway._xds_protos.envoy.extensions.access_loggers.grpc.v3 import als_pb2
from inferway.xds.translate._protos import duration

__all__ = ["grpc_log_common"]


def grpc_log_common(
    log_name: str, cluster: str, flush_s: float | None = None
) -> als_pb2.CommonGrpcAccessLogConfig:
    """``flush_s``: how long Envoy batches entries (None: its default, one second)."""
    common = als_pb2.CommonGrpcAccessLogConfig(
        log_name=log_name,
        grpc_service=grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=cluster)
        ),
        transport_api_version=config_source_pb2.ApiVersion.V3,
    )
    if flush_s is not None:
        common.buffer_flush_interval.CopyFrom(duration(flush_s))
    return common
