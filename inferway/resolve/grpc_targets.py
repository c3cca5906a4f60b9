"""Proxyless gRPC targets in the IR: a route target carries that route exactly as Envoy
serves it (weight overrides from State included, so a rollout moves both kinds of client);
a service target is a catch-all route to that one service."""

from __future__ import annotations

from collections.abc import Mapping

from inferway.policies.grpc_targets import GrpcTarget
from inferway.policies.model import Backend, Route, Service
from inferway.resolve.ir.grpc_target import GrpcTargetIR
from inferway.resolve.ir.route import RouteIR
from inferway.resolve.routes import resolve_route

__all__ = ["resolve_grpc_target"]


def resolve_grpc_target(
    target: GrpcTarget, routes: Mapping[str, RouteIR], services: Mapping[str, Service]
) -> GrpcTargetIR:
    """``routes``: the policy's resolved routes by name. A service target has no timeout
    (0: gRPC clients bring their own deadlines) and the service's hash policy, if any."""
    if target.route is not None:
        return GrpcTargetIR(name=target.name, routes=(routes[target.route],))
    assert target.service is not None  # GrpcTarget guarantees exactly one
    route = Route(name=target.name, backends=[Backend(service=target.service)], timeout=0)
    return GrpcTargetIR(name=target.name, routes=(resolve_route(route, services),))
