"""Small proto helpers shared by the build_* modules (durations, ADS config sources)."""

from google.protobuf.any_pb2 import Any
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.wrappers_pb2 import BoolValue, UInt32Value

from inferway._xds_protos.envoy.config.core.v3 import config_source_pb2

__all__ = ["ads_config_source", "bool_value", "duration", "pack", "uint32_value"]


def duration(seconds: float) -> Duration:
    """Seconds as a proto Duration, rounded to the millisecond so float noise never
    changes the content hash."""
    millis = round(seconds * 1000)
    return Duration(seconds=millis // 1000, nanos=(millis % 1000) * 1_000_000)


def ads_config_source() -> config_source_pb2.ConfigSource:
    """Fetch over the ADS stream of the bootstrap, with the v3 transport."""
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.ApiVersion.V3,
    )


def bool_value(value: bool) -> BoolValue:
    return BoolValue(value=value)


def uint32_value(value: int) -> UInt32Value:
    return UInt32Value(value=value)


def pack(message: Message) -> Any:
    """Wrap a typed config in ``Any`` (type URL ``type.googleapis.com/<full name>``)."""
    packed = Any()
    packed.Pack(message)
    return packed
