"""A cluster for one of inferway's own gRPC peers (the OTLP collector, the feature router):
HTTP/2, its single endpoint inlined (STATIC for an IP address, STRICT_DNS for a hostname,
resolved IPv4 first like service clusters), so it exists in CDS with no EDS resource."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import address_pb2, protocol_pb2
from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from inferway._xds_protos.envoy.extensions.upstreams.http.v3 import (
    http_protocol_options_pb2 as hpo_pb2,
)
from inferway.xds.translate import names
from inferway.xds.translate._protos import duration, pack
from inferway.xds.translate.endpoint import HOSTNAME_DNS_LOOKUP_FAMILY, is_ip_address

__all__ = ["build_inline_http2_cluster"]


def build_inline_http2_cluster(
    name: str, host: str, port: int, connect_timeout: float
) -> cluster_pb2.Cluster:
    cluster = cluster_pb2.Cluster(
        name=name,
        type=(
            cluster_pb2.Cluster.DiscoveryType.STATIC
            if is_ip_address(host)
            else cluster_pb2.Cluster.DiscoveryType.STRICT_DNS
        ),
        connect_timeout=duration(connect_timeout),
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[
                endpoint_components_pb2.LocalityLbEndpoints(
                    lb_endpoints=[
                        endpoint_components_pb2.LbEndpoint(
                            endpoint=endpoint_components_pb2.Endpoint(
                                address=address_pb2.Address(
                                    socket_address=address_pb2.SocketAddress(
                                        address=host, port_value=port
                                    )
                                )
                            )
                        )
                    ]
                )
            ],
        ),
    )
    options = hpo_pb2.HttpProtocolOptions(
        explicit_http_config=hpo_pb2.HttpProtocolOptions.ExplicitHttpConfig(
            http2_protocol_options=protocol_pb2.Http2ProtocolOptions()
        )
    )
    cluster.typed_extension_protocol_options[names.HTTP_PROTOCOL_OPTIONS].CopyFrom(pack(options))
    if cluster.type == cluster_pb2.Cluster.DiscoveryType.STRICT_DNS:
        cluster.dns_lookup_family = HOSTNAME_DNS_LOOKUP_FAMILY  # as service clusters resolve
    return cluster
