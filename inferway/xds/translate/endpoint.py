"""Cluster load assignments: a service's replicas grouped by (priority, zone).

Weights are explicit at both levels: per endpoint (the policy weight) and per locality
(the sum of its endpoints' weights), so locality-weighted balancing sends each zone the
share its replicas add up to. grpcio's xDS client also requires locality weights
(ENVOY_NOTES)."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from itertools import groupby

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2 as ec_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from inferway.policies.model import Endpoint, Service
from inferway.xds.translate import names
from inferway.xds.translate._protos import uint32_value
from inferway.xds.translate.load_balancing import (
    build_assignment_policy,
    resolve_locality_weight,
)

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


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def uses_hostnames(service: Service) -> bool:
    """EDS carries IP addresses only (Envoy NACKs "malformed IP address: localhost"), so a
    service with a hostname endpoint needs a DNS cluster with its endpoints inlined."""
    return not all(is_ip_address(e.host) for e in service.endpoints)


def build_cluster_load_assignment(service: Service) -> endpoint_pb2.ClusterLoadAssignment:
    """Localities sorted by (priority, zone), endpoints by (host, port): reordering replicas
    in the policy does not change the content hash. No endpoints -> an empty assignment
    (Envoy then answers 503 "no healthy upstream" instead of waiting for EDS)."""

    def locality_key(e: Endpoint) -> tuple[int, str]:
        return e.priority, e.zone or ""

    ordered = sorted(service.endpoints, key=lambda e: (*locality_key(e), e.host, e.port))
    groups = [(p, z, list(g)) for (p, z), g in groupby(ordered, key=locality_key)]
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=names.cluster_name(service),
        endpoints=[
            build_locality_endpoints(
                priority,
                zone,
                group,
                weight=resolve_locality_weight(service, zone, [e.weight for e in group]),
            )
            for priority, zone, group in groups
        ],
        policy=build_assignment_policy(service),  # overprovisioning factor, explicit
    )


def build_locality_endpoints(
    priority: int, zone: str, endpoints: Sequence[Endpoint], *, weight: int | None = None
) -> ec_pb2.LocalityLbEndpoints:
    """``weight``: the zone's weight (load_balancing.zones); default the endpoints' sum."""
    group = ec_pb2.LocalityLbEndpoints(
        priority=priority,
        lb_endpoints=[build_lb_endpoint(e) for e in endpoints],
        load_balancing_weight=uint32_value(
            weight if weight is not None else sum(e.weight for e in endpoints)
        ),
    )
    if zone:
        group.locality.CopyFrom(base_pb2.Locality(zone=zone))
    return group


def build_lb_endpoint(endpoint: Endpoint) -> ec_pb2.LbEndpoint:
    return ec_pb2.LbEndpoint(
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
