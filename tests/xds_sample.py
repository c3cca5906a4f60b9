"""Small hand-built Envoy resources for xDS tests: one listener (HCM + RDS over ADS) routing
everything to one EDS cluster whose endpoints are given."""

from __future__ import annotations

from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import address_pb2, config_source_pb2
from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from inferway._xds_protos.envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2, route_pb2
from inferway._xds_protos.envoy.extensions.filters.http.router.v3 import router_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.snapshot import Snapshot, build_snapshot

__all__ = ["ads_source", "build_cluster", "build_fleet", "build_sample_resources"]


def ads_source() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
    )


def _any(message: Message) -> any_pb2.Any:
    holder = any_pb2.Any()
    holder.Pack(message)
    return holder


def _address(host: str, port: int) -> address_pb2.Address:
    return address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=host, port_value=port)
    )


def build_cluster(name: str, *, connect_timeout_ms: int = 1000) -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.EDS,
        connect_timeout=duration_pb2.Duration(nanos=connect_timeout_ms * 1_000_000)
        if connect_timeout_ms < 1000
        else duration_pb2.Duration(seconds=connect_timeout_ms // 1000),
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(eds_config=ads_source()),
    )


def build_sample_resources(
    *,
    listener_port: int,
    backend_ports: list[int],
    listener: str = "ingress",
    cluster: str = "backend",
    extra_clusters: list[cluster_pb2.Cluster] | None = None,
    connect_timeout_ms: int = 1000,
    route_prefix: str = "/",
) -> Resources:
    hcm = hcm_pb2.HttpConnectionManager(
        stat_prefix=listener,
        rds=hcm_pb2.Rds(config_source=ads_source(), route_config_name=listener),
        http_filters=[
            hcm_pb2.HttpFilter(
                name="envoy.filters.http.router", typed_config=_any(router_pb2.Router())
            )
        ],
    )
    listener_proto = listener_pb2.Listener(
        name=listener,
        address=_address("127.0.0.1", listener_port),
        filter_chains=[
            listener_components_pb2.FilterChain(
                filters=[
                    listener_components_pb2.Filter(
                        name="envoy.filters.network.http_connection_manager",
                        typed_config=_any(hcm),
                    )
                ]
            )
        ],
    )
    route = route_pb2.RouteConfiguration(
        name=listener,
        virtual_hosts=[
            route_components_pb2.VirtualHost(
                name=listener,
                domains=["*"],
                routes=[
                    route_components_pb2.Route(
                        match=route_components_pb2.RouteMatch(prefix=route_prefix),
                        route=route_components_pb2.RouteAction(cluster=cluster),
                    )
                ],
            )
        ],
    )
    assignment = endpoint_pb2.ClusterLoadAssignment(
        cluster_name=cluster,
        endpoints=[
            endpoint_components_pb2.LocalityLbEndpoints(
                lb_endpoints=[
                    endpoint_components_pb2.LbEndpoint(
                        endpoint=endpoint_components_pb2.Endpoint(
                            address=_address("127.0.0.1", port)
                        )
                    )
                    for port in backend_ports
                ]
            )
        ],
    )
    clusters = [build_cluster(cluster, connect_timeout_ms=connect_timeout_ms)]
    clusters += extra_clusters or []
    return Resources.build(
        {
            type_urls.LISTENER: [(listener, listener_proto)],
            type_urls.ROUTE: [(listener, route)],
            type_urls.CLUSTER: [(c.name, c) for c in clusters],
            type_urls.ENDPOINT: [(cluster, assignment)],
        }
    )


def build_fleet(
    ports: dict[str, list[int]],
    *,
    listener_port: int = 10000,
    prefix: str = "/",
    route_cluster: str = "a",
) -> Snapshot:
    """Listener "edge" routing to ``route_cluster``, plus one EDS cluster per service with the
    given loopback ports (hand-built resources: this tests the protocol, not the translator)."""
    sample = build_sample_resources(
        listener_port=listener_port,
        backend_ports=ports["a"],
        listener="edge",
        cluster=route_cluster,
        route_prefix=prefix,
    )
    clusters = [(name, build_cluster(name)) for name in ports]
    assignments = [
        (
            name,
            endpoint_pb2.ClusterLoadAssignment(
                cluster_name=name,
                endpoints=[
                    endpoint_components_pb2.LocalityLbEndpoints(
                        lb_endpoints=[
                            endpoint_components_pb2.LbEndpoint(
                                endpoint=endpoint_components_pb2.Endpoint(
                                    address=address_pb2.Address(
                                        socket_address=address_pb2.SocketAddress(
                                            address="127.0.0.1", port_value=port
                                        )
                                    )
                                )
                            )
                            for port in plist
                        ]
                    )
                ],
            ),
        )
        for name, plist in ports.items()
    ]
    return build_snapshot(
        Resources.build(
            {
                type_urls.LISTENER: list(sample.of_type(type_urls.LISTENER).items()),
                type_urls.ROUTE: list(sample.of_type(type_urls.ROUTE).items()),
                type_urls.CLUSTER: clusters,
                type_urls.ENDPOINT: assignments,
            }
        )
    )
