"""Outlier detection: eject replicas that fail real traffic.

Every detector the policy turns on is also *enforced* at 100%: Envoy's defaults enforce
consecutive 5xx only (gateway errors and failure percentage default to 0%, i.e. counted
but never acted on). ``successful_active_health_check_uneject_host`` is always written:
Envoy's default (true) lets a replica that passes its readiness probe but fails real
traffic back in at once (ENVOY_NOTES)."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.cluster.v3 import outlier_detection_pb2
from inferway.resolve.ir.traffic import OutlierDetectionIR
from inferway.xds.translate._protos import bool_value, duration, uint32_value

__all__ = ["build_outlier_detection"]

_ENFORCED = 100
_OFF = 0


def build_outlier_detection(config: OutlierDetectionIR) -> outlier_detection_pb2.OutlierDetection:
    proto = outlier_detection_pb2.OutlierDetection(
        interval=duration(config.interval),
        base_ejection_time=duration(config.base_ejection_time),
        max_ejection_time=duration(config.max_ejection_time),
        max_ejection_percent=uint32_value(config.max_ejection_percent),
        successful_active_health_check_uneject_host=bool_value(config.uneject_on_health_check),
        enforcing_consecutive_5xx=uint32_value(_OFF),
        enforcing_consecutive_gateway_failure=uint32_value(_OFF),
        enforcing_success_rate=uint32_value(_OFF),
        enforcing_failure_percentage=uint32_value(_OFF),
    )
    if config.consecutive_5xx is not None:
        proto.consecutive_5xx.CopyFrom(uint32_value(config.consecutive_5xx))
        proto.enforcing_consecutive_5xx.CopyFrom(uint32_value(_ENFORCED))
    if config.consecutive_gateway_errors is not None:
        proto.consecutive_gateway_failure.CopyFrom(uint32_value(config.consecutive_gateway_errors))
        proto.enforcing_consecutive_gateway_failure.CopyFrom(uint32_value(_ENFORCED))
    if config.success_rate is not None:
        rate = config.success_rate
        proto.enforcing_success_rate.CopyFrom(uint32_value(_ENFORCED))
        proto.success_rate_minimum_hosts.CopyFrom(uint32_value(rate.minimum_hosts))
        proto.success_rate_request_volume.CopyFrom(uint32_value(rate.request_volume))
        proto.success_rate_stdev_factor.CopyFrom(uint32_value(rate.stdev_factor))
    if config.failure_percentage is not None:
        failure = config.failure_percentage
        proto.enforcing_failure_percentage.CopyFrom(uint32_value(_ENFORCED))
        proto.failure_percentage_threshold.CopyFrom(uint32_value(failure.threshold))
        proto.failure_percentage_minimum_hosts.CopyFrom(uint32_value(failure.minimum_hosts))
        proto.failure_percentage_request_volume.CopyFrom(uint32_value(failure.request_volume))
    return proto
