"""Load balancing: the cluster's endpoint-picking policy, panic threshold, zone weighting,
and the route hash policies that give ring_hash / maglev their session affinity.

``load_aware`` is Envoy's ``client_side_weighted_round_robin`` (weights from the ORCA
``endpoint-load-metrics`` reports the backends send). Extension policies cannot be combined
with the locality settings of ``common_lb_config`` (ENVOY_NOTES), so with zones it is
wrapped in ``wrr_locality``, which weights the zones itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import extension_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (
    client_side_weighted_round_robin_pb2 as cswrr_pb2,
)
from envoy.extensions.load_balancing_policies.wrr_locality.v3 import wrr_locality_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf.message import Message
from google.protobuf.wrappers_pb2 import BoolValue, FloatValue

from inferway.policies.model import Route, Service
from inferway.policies.traffic import HashOn, LoadAwareSettings, LoadBalancing
from inferway.xds.translate._protos import duration, pack, uint32_value

__all__ = [
    "CSWRR_POLICY",
    "ORCA_HEADER",
    "WRR_LOCALITY_POLICY",
    "apply_load_balancing",
    "build_assignment_policy",
    "build_client_side_wrr",
    "build_hash_policy",
    "build_route_hash_policies",
    "resolve_load_balancing",
    "resolve_locality_weight",
    "uses_zones",
]

ORCA_HEADER = "endpoint-load-metrics"
"""The response header (HTTP) or trailer (gRPC) inferway backends put their ORCA load report
in (backends/orca.py); Envoy reads it for load_aware, and strips it from responses to clients
(the route configuration drops the header, load_reports.py the trailer)."""
CSWRR_POLICY = "envoy.load_balancing_policies.client_side_weighted_round_robin"
WRR_LOCALITY_POLICY = "envoy.load_balancing_policies.wrr_locality"

_LEGACY = {
    "round_robin": cluster_pb2.Cluster.LbPolicy.ROUND_ROBIN,
    "least_request": cluster_pb2.Cluster.LbPolicy.LEAST_REQUEST,
    "random": cluster_pb2.Cluster.LbPolicy.RANDOM,
    "ring_hash": cluster_pb2.Cluster.LbPolicy.RING_HASH,
    "maglev": cluster_pb2.Cluster.LbPolicy.MAGLEV,
}
_HASHING = frozenset({"ring_hash", "maglev"})


def resolve_load_balancing(service: Service) -> LoadBalancing:
    return service.load_balancing or LoadBalancing()


def uses_zones(service: Service) -> bool:
    """Zones turn on locality-weighted balancing: traffic first splits across a tier's
    zones by weight, then across the zone's endpoints."""
    return any(e.zone is not None for e in service.endpoints)


def resolve_locality_weight(service: Service, zone: str, endpoint_weights: Sequence[int]) -> int:
    """The configured weight of ``zone``, else the sum of its endpoints' weights (a zone
    the policy's ``zones`` map does not name also falls back to the sum: endpoints can
    come from a runtime source the policy file never saw)."""
    zones = resolve_load_balancing(service).zones or {}
    return zones.get(zone, sum(endpoint_weights))


def build_assignment_policy(service: Service) -> endpoint_pb2.ClusterLoadAssignment.Policy:
    """Envoy's default overprovisioning factor (140) is written out so the config says when
    a tier starts spilling to the next (ENVOY_NOTES)."""
    return endpoint_pb2.ClusterLoadAssignment.Policy(
        overprovisioning_factor=uint32_value(
            resolve_load_balancing(service).overprovisioning_factor
        )
    )


def apply_load_balancing(cluster: cluster_pb2.Cluster, service: Service) -> None:
    """Set the endpoint-picking policy and the explicit panic threshold on ``cluster``."""
    lb = resolve_load_balancing(service)
    cluster.common_lb_config.healthy_panic_threshold.CopyFrom(
        percent_pb2.Percent(value=lb.panic_threshold)
    )
    if lb.policy == "load_aware":
        cluster.ClearField("lb_policy")
        cluster.load_balancing_policy.CopyFrom(
            _load_aware_policy(lb.load_aware, zoned=uses_zones(service))
        )
        return
    cluster.lb_policy = _LEGACY[lb.policy]
    if lb.policy == "least_request":
        cluster.least_request_lb_config.choice_count.CopyFrom(uint32_value(lb.choice_count))
    if uses_zones(service):
        cluster.common_lb_config.locality_weighted_lb_config.SetInParent()


def build_client_side_wrr(settings: LoadAwareSettings) -> cswrr_pb2.ClientSideWeightedRoundRobin:
    """Weights from per-response ORCA headers (no out-of-band reporting stream)."""
    return cswrr_pb2.ClientSideWeightedRoundRobin(
        enable_oob_load_report=BoolValue(value=False),
        blackout_period=duration(settings.blackout_period),
        weight_expiration_period=duration(settings.weight_expiration_period),
        weight_update_period=duration(settings.weight_update_period),
        error_utilization_penalty=FloatValue(value=settings.error_utilization_penalty),
    )


def _load_aware_policy(
    settings: LoadAwareSettings, *, zoned: bool
) -> cluster_pb2.LoadBalancingPolicy:
    picker = _policy(CSWRR_POLICY, build_client_side_wrr(settings))
    if zoned:
        picker = _policy(
            WRR_LOCALITY_POLICY,
            wrr_locality_pb2.WrrLocality(
                endpoint_picking_policy=cluster_pb2.LoadBalancingPolicy(policies=[picker])
            ),
        )
    return cluster_pb2.LoadBalancingPolicy(policies=[picker])


def _policy(name: str, config: Message) -> cluster_pb2.LoadBalancingPolicy.Policy:
    return cluster_pb2.LoadBalancingPolicy.Policy(
        typed_extension_config=extension_pb2.TypedExtensionConfig(
            name=name,
            typed_config=pack(config),
        )
    )


def build_hash_policy(hash_on: HashOn) -> rc_pb2.RouteAction.HashPolicy:
    if hash_on.header is not None:
        return rc_pb2.RouteAction.HashPolicy(
            header=rc_pb2.RouteAction.HashPolicy.Header(header_name=hash_on.header)
        )
    if hash_on.cookie is not None:
        cookie = rc_pb2.RouteAction.HashPolicy.Cookie(name=hash_on.cookie.name)
        if hash_on.cookie.ttl is not None:
            cookie.ttl.CopyFrom(duration(hash_on.cookie.ttl))
        if hash_on.cookie.path is not None:
            cookie.path = hash_on.cookie.path
        return rc_pb2.RouteAction.HashPolicy(cookie=cookie)
    return rc_pb2.RouteAction.HashPolicy(
        connection_properties=rc_pb2.RouteAction.HashPolicy.ConnectionProperties(source_ip=True)
    )


def build_route_hash_policies(
    route: Route, services: Mapping[str, Service]
) -> list[rc_pb2.RouteAction.HashPolicy]:
    """Hash policies for the route's hashing backends, one per distinct ``hash_on`` in
    backend order. Envoy hashes on the route, the cluster's ring or table picks the host."""
    seen: list[HashOn] = []
    for backend in route.backends:
        service = services.get(backend.service)
        if service is None or service.load_balancing is None:
            continue
        lb = service.load_balancing
        if lb.policy in _HASHING and lb.hash_on is not None and lb.hash_on not in seen:
            seen.append(lb.hash_on)
    return [build_hash_policy(h) for h in seen]
