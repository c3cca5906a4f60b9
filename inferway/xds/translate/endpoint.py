"""Cluster load assignments: a service's replicas grouped by (priority, zone).

Weights are explicit at both levels: per endpoint and per locality (resolved: the zone's
configured weight, else the sum of its endpoints' weights), so locality-weighted balancing
sends each zone its share. grpcio's xDS client also requires locality weights (ENVOY_NOTES)."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import address_pb2, base_pb2, health_check_pb2
from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_components_pb2 as ec_pb2
from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_pb2
from inferway.policies.types import is_ip_address
from inferway.resolve.ir.service import EndpointIR, LocalityIR, ServiceIR
from inferway.xds.translate._protos import uint32_value
from inferway.xds.translate.load_balancing import build_assignment_policy

__all__ = [
    "HOSTNAME_DNS_LOOKUP_FAMILY",
    "build_cluster_load_assignment",
    "build_lb_endpoint",
    "build_locality_endpoints",
    "is_ip_address",
    "uses_hostnames",
]

HOSTNAME_DNS_LOOKUP_FAMILY = cluster_pb2.Cluster.DnsLookupFamily.V4_PREFERRED
"""How every DNS cluster resolves a hostname: IPv4 first, so "localhost" reaches a server
bound to 127.0.0.1 only (Envoy's default, AUTO, tries IPv6 first)."""


def uses_hostnames(service: ServiceIR) -> bool:
    """EDS carries IP addresses only (Envoy NACKs "malformed IP address: localhost"), so a
    service with a hostname endpoint needs a DNS cluster with its endpoints inlined."""
    return not all(is_ip_address(e.host) for e in service.endpoints)


def build_cluster_load_assignment(service: ServiceIR) -> endpoint_pb2.ClusterLoadAssignment:
    """The IR's localities in its order (resolve sorts them, so reordering replicas does
    not change the content hash). No endpoints -> an empty assignment (Envoy then answers
    503 "no healthy upstream" instead of waiting for EDS)."""
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=service.name,
        endpoints=[build_locality_endpoints(locality) for locality in service.localities],
        policy=build_assignment_policy(service.load_balancing),
    )


def build_locality_endpoints(locality: LocalityIR) -> ec_pb2.LocalityLbEndpoints:
    group = ec_pb2.LocalityLbEndpoints(
        priority=locality.priority,
        lb_endpoints=[build_lb_endpoint(e) for e in locality.endpoints],
        load_balancing_weight=uint32_value(locality.weight),
    )
    if locality.zone or locality.region:
        group.locality.CopyFrom(base_pb2.Locality(region=locality.region, zone=locality.zone))
    return group


def build_lb_endpoint(endpoint: EndpointIR) -> ec_pb2.LbEndpoint:
    lb_endpoint = ec_pb2.LbEndpoint(
        endpoint=ec_pb2.Endpoint(
            address=address_pb2.Address(
                socket_address=address_pb2.SocketAddress(
                    address=endpoint.host,
                    port_value=endpoint.port,
                    protocol=address_pb2.SocketAddress.Protocol.TCP,
                )
            )
        ),
        load_balancing_weight=uint32_value(endpoint.weight),
    )
    if endpoint.degraded:  # Envoy's hash tables leave it out while others are healthy
        lb_endpoint.health_status = health_check_pb2.HealthStatus.DEGRADED
    return lb_endpoint
