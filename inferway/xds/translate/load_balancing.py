"""Load balancing: the cluster's endpoint-picking policy, panic threshold, zone weighting,
and the route hash policies that give ring_hash / maglev their session affinity.

``load_aware`` is Envoy's ``client_side_weighted_round_robin`` (weights from the ORCA
``endpoint-load-metrics`` reports the backends send). Extension policies cannot be combined
with the locality settings of ``common_lb_config`` (ENVOY_NOTES), so with zones it is
wrapped in ``wrr_locality``, which weights the zones itself.
"""

from __future__ import annotations

from google.protobuf.message import Message
from google.protobuf.wrappers_pb2 import BoolValue, FloatValue

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.core.v3 import extension_pb2
from inferway._xds_protos.envoy.config.endpoint.v3 import endpoint_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3 import (  # noqa: E501
    client_side_weighted_round_robin_pb2 as cswrr_pb2,
)
from inferway._xds_protos.envoy.extensions.load_balancing_policies.wrr_locality.v3 import (
    wrr_locality_pb2,
)
from inferway._xds_protos.envoy.type.v3 import percent_pb2
from inferway.resolve.ir.route import HashPolicyIR
from inferway.resolve.ir.traffic import LoadAwareIR, LoadBalancingIR
from inferway.xds.translate._protos import duration, pack, uint32_value

__all__ = [
    "CSWRR_POLICY",
    "ORCA_HEADER",
    "WRR_LOCALITY_POLICY",
    "apply_load_balancing",
    "build_assignment_policy",
    "build_client_side_wrr",
    "build_hash_policy",
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


def build_assignment_policy(lb: LoadBalancingIR) -> endpoint_pb2.ClusterLoadAssignment.Policy:
    """The overprovisioning factor is always written out (Envoy's default, 140, included)
    so the config says when a tier starts spilling to the next (ENVOY_NOTES)."""
    return endpoint_pb2.ClusterLoadAssignment.Policy(
        overprovisioning_factor=uint32_value(lb.overprovisioning_factor)
    )


def apply_load_balancing(cluster: cluster_pb2.Cluster, lb: LoadBalancingIR) -> None:
    """Set the endpoint-picking policy and the explicit panic threshold on ``cluster``."""
    cluster.common_lb_config.healthy_panic_threshold.CopyFrom(
        percent_pb2.Percent(value=lb.panic_threshold)
    )
    if lb.load_aware is not None:
        cluster.ClearField("lb_policy")
        cluster.load_balancing_policy.CopyFrom(
            _load_aware_policy(lb.load_aware, zoned=lb.locality_weighted)
        )
        return
    cluster.lb_policy = _LEGACY[lb.policy]
    if lb.choice_count is not None:
        cluster.least_request_lb_config.choice_count.CopyFrom(uint32_value(lb.choice_count))
    if lb.locality_weighted:
        cluster.common_lb_config.locality_weighted_lb_config.SetInParent()


def build_client_side_wrr(settings: LoadAwareIR) -> cswrr_pb2.ClientSideWeightedRoundRobin:
    """Weights from per-response ORCA headers (no out-of-band reporting stream)."""
    return cswrr_pb2.ClientSideWeightedRoundRobin(
        enable_oob_load_report=BoolValue(value=False),
        blackout_period=duration(settings.blackout_period),
        weight_expiration_period=duration(settings.weight_expiration_period),
        weight_update_period=duration(settings.weight_update_period),
        error_utilization_penalty=FloatValue(value=settings.error_utilization_penalty),
    )


def _load_aware_policy(settings: LoadAwareIR, *, zoned: bool) -> cluster_pb2.LoadBalancingPolicy:
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


def build_hash_policy(hash_on: HashPolicyIR) -> rc_pb2.RouteAction.HashPolicy:
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
