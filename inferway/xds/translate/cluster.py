"""Clusters: one per service, endpoints delivered by EDS over ADS so a replica change
touches only its ClusterLoadAssignment, never the cluster (which would drain it).

EDS accepts IP addresses only; a service with any hostname endpoint (``localhost:8000``)
becomes a STRICT_DNS cluster with its load assignment inlined, and gets no EDS resource."""

from __future__ import annotations

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import address_pb2, protocol_pb2
from inferway._xds_protos.envoy.extensions.upstreams.http.v3 import (
    http_protocol_options_pb2 as hpo_pb2,
)
from inferway.resolve.ir.service import ServiceIR
from inferway.xds.translate import names
from inferway.xds.translate._protos import ads_config_source, duration, pack, uint32_value
from inferway.xds.translate.circuit_breakers import build_circuit_breakers
from inferway.xds.translate.endpoint import (
    HOSTNAME_DNS_LOOKUP_FAMILY,
    build_cluster_load_assignment,
    uses_hostnames,
)
from inferway.xds.translate.health_check import build_health_check
from inferway.xds.translate.load_balancing import apply_load_balancing
from inferway.xds.translate.outlier_detection import build_outlier_detection
from inferway.xds.translate.served_by import build_service_metadata
from inferway.xds.translate.tls import build_service_transport_socket

__all__ = ["build_cluster", "build_http_protocol_options"]


def build_http_protocol_options(service: ServiceIR) -> hpo_pb2.HttpProtocolOptions:
    """Upstream protocol is explicit either way, so the rendered config says what is spoken."""
    if service.protocol == "http2":
        explicit = hpo_pb2.HttpProtocolOptions.ExplicitHttpConfig(
            http2_protocol_options=protocol_pb2.Http2ProtocolOptions()
        )
    else:
        explicit = hpo_pb2.HttpProtocolOptions.ExplicitHttpConfig(
            http_protocol_options=protocol_pb2.Http1ProtocolOptions()
        )
    return hpo_pb2.HttpProtocolOptions(explicit_http_config=explicit)


def build_cluster(service: ServiceIR) -> cluster_pb2.Cluster:
    cluster = cluster_pb2.Cluster(
        name=service.name,
        connect_timeout=duration(service.connect_timeout),
        # A replica removed from the endpoints leaves rotation at once, even while it still
        # passes health checks (Envoy's default keeps it until a check fails).
        ignore_health_on_host_removal=True,
        metadata=build_service_metadata(service.name),  # what x-inferway-pool shows
    )
    if uses_hostnames(service):
        cluster.type = cluster_pb2.Cluster.DiscoveryType.STRICT_DNS
        cluster.dns_lookup_family = HOSTNAME_DNS_LOOKUP_FAMILY
        cluster.load_assignment.CopyFrom(build_cluster_load_assignment(service))
    else:
        cluster.type = cluster_pb2.Cluster.DiscoveryType.EDS
        cluster.eds_cluster_config.CopyFrom(
            cluster_pb2.Cluster.EdsClusterConfig(
                eds_config=ads_config_source(),
                service_name=service.name,
            )
        )
    cluster.typed_extension_protocol_options[names.HTTP_PROTOCOL_OPTIONS].CopyFrom(
        pack(build_http_protocol_options(service))
    )
    apply_load_balancing(cluster, service.load_balancing)  # policy, panic, zone weighting
    if service.health_check is not None:
        cluster.health_checks.append(build_health_check(service.health_check, service.protocol))
    if service.outlier_detection is not None:
        cluster.outlier_detection.CopyFrom(build_outlier_detection(service.outlier_detection))
    cluster.circuit_breakers.CopyFrom(build_circuit_breakers(service.circuit_breakers))
    if service.tcp_keepalive is not None:
        keepalive = service.tcp_keepalive  # a silent zone's idle connections get closed
        cluster.upstream_connection_options.tcp_keepalive.CopyFrom(
            address_pb2.TcpKeepalive(
                keepalive_time=uint32_value(keepalive.idle_s),
                keepalive_interval=uint32_value(keepalive.interval_s),
                keepalive_probes=uint32_value(keepalive.probes),
            )
        )
    transport_socket = build_service_transport_socket(service)
    if transport_socket is not None:
        cluster.transport_socket.CopyFrom(transport_socket)
    return cluster
