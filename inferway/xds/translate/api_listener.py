"""What a proxyless gRPC client gets for one target: an API listener named after the target
(the name it dials, ``xds:///<name>``) and the route configuration that listener names.

gRPC's xDS client (gRFC A27, A28) reads a Listener's ``api_listener`` as an HTTP connection
manager and NACKs any HTTP filter it does not implement unless the filter is optional, so
the chain is the router alone: whatever else Envoy's chain does (access rules, rate limits,
ORCA trailers) the policy checks keep away from targets. gRPC ignores a route's ``timeout``
and reads ``max_stream_duration`` instead, so the route timeout is written there.
"""

from __future__ import annotations

from inferway._xds_protos.envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.resolve.ir.grpc_target import GrpcTargetIR
from inferway.resolve.ir.route import RouteIR
from inferway.xds.translate._protos import ads_config_source, duration, pack
from inferway.xds.translate.listener import build_router_filter
from inferway.xds.translate.load_balancing import build_hash_policy
from inferway.xds.translate.route import build_route_match, build_weighted_clusters

__all__ = ["build_api_listener", "build_grpc_route", "build_target_route_configuration"]


def build_api_listener(target: GrpcTargetIR) -> listener_pb2.Listener:
    """No address: an API listener is consumed in-process by the client library."""
    manager = hcm_pb2.HttpConnectionManager(
        stat_prefix=target.name,
        http_filters=[build_router_filter()],
        rds=hcm_pb2.Rds(config_source=ads_config_source(), route_config_name=target.name),
    )
    return listener_pb2.Listener(
        name=target.name,
        api_listener=api_listener_pb2.ApiListener(api_listener=pack(manager)),
    )


def build_target_route_configuration(target: GrpcTargetIR) -> route_pb2.RouteConfiguration:
    """One catch-all virtual host: the client's authority is the target name, and ``*``
    matches it whatever the client's bootstrap says."""
    return route_pb2.RouteConfiguration(
        name=target.name,
        virtual_hosts=[
            rc_pb2.VirtualHost(
                name=target.name,
                domains=["*"],
                routes=[build_grpc_route(r) for r in target.routes],
            )
        ],
    )


def build_grpc_route(route: RouteIR) -> rc_pb2.Route:
    """Match, weighted backends and hash policies as Envoy's route has them. Retries are
    left out: gRPC retries on gRPC status names (gRFC A44), which Envoy's HTTP retry
    conditions do not translate to."""
    action = rc_pb2.RouteAction(
        hash_policy=[build_hash_policy(h) for h in route.hash_policies],
    )
    if len(route.backends) == 1:
        action.cluster = route.backends[0].service
    else:
        action.weighted_clusters.CopyFrom(build_weighted_clusters(route.backends))
    if route.timeout > 0:
        action.max_stream_duration.max_stream_duration.CopyFrom(duration(route.timeout))
    return rc_pb2.Route(
        name=route.name,
        match=build_route_match(route.match.path, route.match.headers),
        route=action,
    )
