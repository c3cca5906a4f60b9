"""Active health checks: Envoy probes every replica and takes failing ones out of rotation.

Intervals are always explicit (resolve fills them in): Envoy's ``no_traffic_interval``
defaults to 60 s, so a service that has had no traffic yet would notice a dead replica only
once a minute (ENVOY_NOTES)."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.core.v3 import health_check_pb2
from inferway._xds_protos.envoy.type.v3 import http_pb2
from inferway.resolve.ir.traffic import HealthCheckIR
from inferway.xds.translate._protos import duration, uint32_value

__all__ = ["build_health_check"]


def build_health_check(check: HealthCheckIR, protocol: str) -> health_check_pb2.HealthCheck:
    proto = health_check_pb2.HealthCheck(
        timeout=duration(check.timeout),
        interval=duration(check.interval),
        no_traffic_interval=duration(check.no_traffic_interval),
        unhealthy_threshold=uint32_value(check.unhealthy_threshold),
        healthy_threshold=uint32_value(check.healthy_threshold),
    )
    if check.unhealthy_interval is not None:
        proto.unhealthy_interval.CopyFrom(duration(check.unhealthy_interval))
    if check.type == "grpc":
        proto.grpc_health_check.CopyFrom(
            health_check_pb2.HealthCheck.GrpcHealthCheck(service_name=check.grpc_service)
        )
    else:
        proto.http_health_check.CopyFrom(
            health_check_pb2.HealthCheck.HttpHealthCheck(
                path=check.path,
                codec_client_type=(
                    http_pb2.CodecClientType.HTTP2
                    if protocol == "http2"
                    else http_pb2.CodecClientType.HTTP1
                ),
            )
        )
    return proto
