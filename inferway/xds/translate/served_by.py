"""Served-by headers: every answer names the service (``x-inferway-pool``) and the replica
(``x-inferway-replica``, host:port) that served it, so routing can be checked from outside.

The pool is read from the cluster's own metadata (``inferway.service``, set on every service
cluster), not from the cluster's name, so the header carries the policy's service name
whatever Envoy calls the cluster. Both headers are removed from what clients send upstream
and from what upstreams answer, so neither side can forge them; a route with them off only
removes them. Local replies (no upstream) get neither.
"""

from __future__ import annotations

from google.protobuf import struct_pb2

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway.resolve.ir.route import RouteIR

__all__ = [
    "METADATA_NAMESPACE",
    "POOL_HEADER",
    "REPLICA_HEADER",
    "SERVED_BY_HEADERS",
    "add_served_by_headers",
    "build_service_metadata",
]

POOL_HEADER = "x-inferway-pool"
REPLICA_HEADER = "x-inferway-replica"
SERVED_BY_HEADERS = (POOL_HEADER, REPLICA_HEADER)
METADATA_NAMESPACE = "inferway"
_POOL_FORMAT = f"%CLUSTER_METADATA({METADATA_NAMESPACE}:service)%"
_REPLICA_FORMAT = "%UPSTREAM_HOST%"


def build_service_metadata(service: str) -> base_pb2.Metadata:
    """Cluster metadata naming the policy service (what ``x-inferway-pool`` shows)."""
    fields = struct_pb2.Struct()
    fields.update({"service": service})
    return base_pb2.Metadata(filter_metadata={METADATA_NAMESPACE: fields})


def add_served_by_headers(proto: rc_pb2.Route, route: RouteIR) -> None:
    """Remove whatever the upstream sent under these names, then (when on) add the real
    ones; removal runs before additions at one level, so both sit on the route."""
    proto.response_headers_to_remove.extend(SERVED_BY_HEADERS)
    if not route.served_by_headers:
        return
    overwrite = base_pb2.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD
    for key, value in ((POOL_HEADER, _POOL_FORMAT), (REPLICA_HEADER, _REPLICA_FORMAT)):
        proto.response_headers_to_add.append(
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=key, value=value), append_action=overwrite
            )
        )
