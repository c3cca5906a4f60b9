"""A static Envoy bootstrap holding translated resources, for ``envoy --mode validate``.

Envoy validates dynamic (xDS) resources only when a control plane pushes them; a static
bootstrap with the same protos lets tests and ``inferway validate`` have the real binary
check the translator's output without a server: each listener's RDS reference is replaced
by its RouteConfiguration inlined, and each EDS cluster gets its ClusterLoadAssignment
inlined as ``load_assignment`` (STATIC for IP endpoints, STRICT_DNS when any is a hostname).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format

from inferway._xds_protos.envoy.config.bootstrap.v3 import bootstrap_pb2
from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import address_pb2
from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_pb2
from inferway._xds_protos.envoy.config.listener.v3 import listener_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.translate import names
from inferway.xds.translate.endpoint import is_ip_address
from inferway.xds.translate.tls_validation import inline_static_secrets

__all__ = ["build_envoy_validation_bootstrap"]


def build_envoy_validation_bootstrap(
    resources: Resources, *, admin_address: str = "127.0.0.1", admin_port: int = 0
) -> dict[str, Any]:
    """JSON/YAML-able bootstrap; raises ValueError naming what is missing when a listener's
    route configuration or a cluster's load assignment is absent from ``resources``."""
    routes = resources.typed(type_urls.ROUTE, route_pb2.RouteConfiguration)
    assignments = resources.typed(type_urls.ENDPOINT, endpoint_pb2.ClusterLoadAssignment)
    bootstrap = bootstrap_pb2.Bootstrap(
        admin=bootstrap_pb2.Admin(
            address=address_pb2.Address(
                socket_address=address_pb2.SocketAddress(
                    address=admin_address, port_value=admin_port
                )
            )
        ),
        static_resources=bootstrap_pb2.Bootstrap.StaticResources(
            listeners=[
                _inline_routes(listener, routes)
                for listener in resources.typed(type_urls.LISTENER, listener_pb2.Listener).values()
            ],
            clusters=[
                _inline_endpoints(cluster, assignments)
                for cluster in resources.typed(type_urls.CLUSTER, cluster_pb2.Cluster).values()
            ],
        ),
    )
    inline_static_secrets(bootstrap.static_resources, resources)
    body = json_format.MessageToDict(bootstrap, preserving_proto_field_name=True)
    plain: dict[str, Any] = json.loads(json.dumps(body))  # protobuf renders Any as OrderedDict
    return plain


def _inline_routes(
    listener: listener_pb2.Listener, routes: Mapping[str, route_pb2.RouteConfiguration]
) -> listener_pb2.Listener:
    static = listener_pb2.Listener()
    static.CopyFrom(listener)
    for chain in static.filter_chains:
        for network_filter in chain.filters:
            if network_filter.name != names.HCM_FILTER:
                continue
            manager = hcm_pb2.HttpConnectionManager()
            network_filter.typed_config.Unpack(manager)
            if manager.HasField("rds"):
                name = manager.rds.route_config_name
                if name not in routes:
                    raise ValueError(
                        f"listener {listener.name!r} uses route configuration {name!r}, "
                        "which is not among the resources"
                    )
                manager.route_config.CopyFrom(routes[name])  # replaces the rds oneof member
            network_filter.typed_config.Pack(manager)
    return static


def _inline_endpoints(
    cluster: cluster_pb2.Cluster, assignments: Mapping[str, endpoint_pb2.ClusterLoadAssignment]
) -> cluster_pb2.Cluster:
    static = cluster_pb2.Cluster()
    static.CopyFrom(cluster)
    if static.type != cluster_pb2.Cluster.DiscoveryType.EDS:
        return static
    name = static.eds_cluster_config.service_name or static.name
    if name not in assignments:
        raise ValueError(
            f"cluster {cluster.name!r} uses endpoints {name!r}, which are not among the resources"
        )
    assignment = assignments[name]
    static.ClearField("eds_cluster_config")
    static.load_assignment.CopyFrom(assignment)
    hosts = [
        lb.endpoint.address.socket_address.address
        for group in assignment.endpoints
        for lb in group.lb_endpoints
    ]
    static.type = (
        cluster_pb2.Cluster.DiscoveryType.STATIC
        if all(is_ip_address(h) for h in hosts)
        else cluster_pb2.Cluster.DiscoveryType.STRICT_DNS
    )
    return static
