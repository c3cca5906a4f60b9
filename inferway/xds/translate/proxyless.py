"""IR -> the resources a proxyless gRPC client can consume, for the targets it may see.

Envoy's resources (``translate``) carry filters, health checks and TLS a gRPC client does
not implement, and gRPC NACKs what it does not understand, so its snapshot is built on its
own: API listeners and route configurations per target (api_listener.py), and for every
service a target reaches an EDS cluster and a load assignment gRPC accepts. gRPC requires
``locality`` on every locality entry ("endpoints[0].locality: field not present") and a
locality weight (a locality without one is ignored, gRFC A27), and priorities numbered
0, 1, 2, ... without gaps.
"""

from __future__ import annotations

from collections.abc import Collection

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_pb2
from inferway.resolve.ir import IR
from inferway.resolve.ir.service import ServiceIR
from inferway.resolve.ir.traffic import LoadBalancingIR
from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.translate._protos import ads_config_source, duration, uint32_value
from inferway.xds.translate.api_listener import build_api_listener, build_target_route_configuration
from inferway.xds.translate.circuit_breakers import build_circuit_breakers
from inferway.xds.translate.endpoint import build_locality_endpoints
from inferway.xds.translate.outlier_detection import build_outlier_detection

__all__ = [
    "build_proxyless_cluster",
    "build_proxyless_load_assignment",
    "translate_proxyless",
]

_GRPC_LB = {
    "least_request": cluster_pb2.Cluster.LbPolicy.LEAST_REQUEST,
    "ring_hash": cluster_pb2.Cluster.LbPolicy.RING_HASH,
    "maglev": cluster_pb2.Cluster.LbPolicy.RING_HASH,
}
"""gRPC has no maglev (ring_hash is its consistent hash) and no random; load_aware needs
binary ORCA trailers inferway's backends do not send, so it is plain round robin here."""


def translate_proxyless(ir: IR, targets: Collection[str] | None = None) -> Resources:
    """The IR's gRPC targets (only those named in ``targets`` when given; unknown names are
    simply not there), with the clusters and assignments of the services they reach."""
    chosen = [t for t in ir.grpc_targets if targets is None or t.name in targets]
    reached = {name for t in chosen for name in t.services}
    services = [s for s in ir.services if s.name in reached]
    return Resources.build(
        {
            type_urls.LISTENER: [(t.name, build_api_listener(t)) for t in chosen],
            type_urls.ROUTE: [(t.name, build_target_route_configuration(t)) for t in chosen],
            type_urls.CLUSTER: [(s.name, build_proxyless_cluster(s)) for s in services],
            type_urls.ENDPOINT: [(s.name, build_proxyless_load_assignment(s)) for s in services],
        }
    )


def build_proxyless_cluster(service: ServiceIR) -> cluster_pb2.Cluster:
    """EDS over ADS, the load-balancing policy gRPC has closest to the service's, its
    outlier detection and request limit (gRFC A50, A32); no health checks (gRPC does not
    probe; a dead replica's connection fails and the picker skips it)."""
    cluster = cluster_pb2.Cluster(
        name=service.name,
        type=cluster_pb2.Cluster.DiscoveryType.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(
            eds_config=ads_config_source(), service_name=service.name
        ),
        connect_timeout=duration(service.connect_timeout),
        lb_policy=_lb_policy(service.load_balancing),
    )
    lb = service.load_balancing
    if lb.policy == "least_request" and lb.choice_count is not None:
        cluster.least_request_lb_config.choice_count.CopyFrom(uint32_value(lb.choice_count))
    if service.outlier_detection is not None:
        cluster.outlier_detection.CopyFrom(build_outlier_detection(service.outlier_detection))
    cluster.circuit_breakers.CopyFrom(build_circuit_breakers(service.circuit_breakers))
    return cluster


def _lb_policy(lb: LoadBalancingIR) -> cluster_pb2.Cluster.LbPolicy.ValueType:
    return _GRPC_LB.get(lb.policy, cluster_pb2.Cluster.LbPolicy.ROUND_ROBIN)


def build_proxyless_load_assignment(service: ServiceIR) -> endpoint_pb2.ClusterLoadAssignment:
    """Envoy's localities with ``locality`` always set (empty for endpoints without a zone)
    and priorities renumbered densely in their order."""
    tiers = {p: i for i, p in enumerate(sorted({loc.priority for loc in service.localities}))}
    groups = []
    for locality in service.localities:
        group = build_locality_endpoints(locality)
        group.locality.SetInParent()
        group.priority = tiers[locality.priority]
        groups.append(group)
    return endpoint_pb2.ClusterLoadAssignment(cluster_name=service.name, endpoints=groups)
