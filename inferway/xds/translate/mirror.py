"""Request mirroring: Envoy sends a copy of a share of a route's requests to another
cluster and discards that cluster's answers, so a canary meets real inputs without any
client seeing what it says. The copy keeps the request's ``x-request-id`` (its Host gets a
``-shadow`` suffix), which is what lets the output-agreement check pair the two answers."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.core.v3 import base_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.type.v3 import percent_pb2
from inferway.resolve.ir.route import RouteIR

__all__ = ["add_route_mirror", "build_mirror_policy", "per_million"]


def per_million(numerator: int) -> percent_pb2.FractionalPercent:
    """A share in parts of a million: Envoy's finest denominator, so 0.01% stays exact."""
    return percent_pb2.FractionalPercent(
        numerator=numerator, denominator=percent_pb2.FractionalPercent.DenominatorType.MILLION
    )


def build_mirror_policy(route: RouteIR) -> rc_pb2.RouteAction.RequestMirrorPolicy:
    assert route.mirror is not None
    return rc_pb2.RouteAction.RequestMirrorPolicy(
        cluster=route.mirror.service,
        runtime_fraction=base_pb2.RuntimeFractionalPercent(
            default_value=per_million(route.mirror.per_million)
        ),
    )


def add_route_mirror(action: rc_pb2.RouteAction, route: RouteIR) -> None:
    """Attach the route's mirror (nothing when it has none)."""
    if route.mirror is not None:
        action.request_mirror_policies.append(build_mirror_policy(route))
