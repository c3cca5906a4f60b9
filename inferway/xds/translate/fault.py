"""Fault injection: Envoy aborts or delays a share of a route's requests itself, so a
rollback can be rehearsed (a canary made to fail on purpose) without touching a backend.

Like the local rate limit, the HTTP filter sits in the listener's chain with no fault of its
own, which injects nothing; each route with a ``fault`` replaces that config with its own in
``typed_per_filter_config``. Aborted requests never reach the upstream."""

from __future__ import annotations

from collections.abc import Sequence

from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.extensions.filters.common.fault.v3 import (
    fault_pb2 as common_fault_pb2,
)
from inferway._xds_protos.envoy.extensions.filters.http.fault.v3 import fault_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.resolve.ir.route import RouteIR
from inferway.resolve.ir.route_traffic import FaultIR
from inferway.xds.translate import names
from inferway.xds.translate._protos import duration, pack
from inferway.xds.translate.mirror import per_million

__all__ = ["FAULT_FILTER", "add_route_fault", "apply_fault", "build_fault"]

FAULT_FILTER = "envoy.filters.http.fault"


def apply_fault(manager: hcm_pb2.HttpConnectionManager, routes: Sequence[RouteIR]) -> None:
    """Insert the (empty) filter just before the router when any of ``routes`` (those served
    on the manager's listener) injects faults."""
    if not any(r.fault is not None for r in routes):
        return
    position = next(
        (i for i, f in enumerate(manager.http_filters) if f.name == names.ROUTER_FILTER),
        len(manager.http_filters),
    )
    manager.http_filters.insert(
        position, hcm_pb2.HttpFilter(name=FAULT_FILTER, typed_config=pack(fault_pb2.HTTPFault()))
    )


def add_route_fault(route_proto: rc_pb2.Route, route: RouteIR) -> None:
    """Attach the route's faults (nothing when it has none)."""
    if route.fault is not None:
        route_proto.typed_per_filter_config[FAULT_FILTER].CopyFrom(pack(build_fault(route.fault)))


def build_fault(fault: FaultIR) -> fault_pb2.HTTPFault:
    proto = fault_pb2.HTTPFault()
    if fault.abort is not None:
        proto.abort.CopyFrom(
            fault_pb2.FaultAbort(
                http_status=fault.abort.status, percentage=per_million(fault.abort.per_million)
            )
        )
    if fault.delay is not None:
        proto.delay.CopyFrom(
            common_fault_pb2.FaultDelay(
                fixed_delay=duration(fault.delay.seconds),
                percentage=per_million(fault.delay.per_million),
            )
        )
    return proto
