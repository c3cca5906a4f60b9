"""Translation of the traffic settings: the structural rules goldens do not state outright."""

from __future__ import annotations

from typing import Any

from inferway._xds_protos.envoy.extensions.filters.http.header_mutation.v3 import (
    header_mutation_pb2,
)
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.backends.telemetry.orca import ORCA_HEADER as BACKEND_ORCA_HEADER
from inferway.policies import Policy
from inferway.resolve import resolve_policy
from inferway.xds import type_urls
from inferway.xds.translate import names, translate
from inferway.xds.translate.load_balancing import (
    CSWRR_POLICY,
    ORCA_HEADER,
    WRR_LOCALITY_POLICY,
)
from inferway.xds.translate.load_reports import LOAD_REPORT_FILTER
from inferway.xds.translate.rate_limit import LOCAL_RATE_LIMIT_FILTER


def _translate(service: dict[str, Any], route: dict[str, Any] | None = None) -> Any:
    policy = Policy.model_validate(
        {
            "listeners": [{"name": "main", "port": 10000}],
            "services": [{"name": "m", **service}],
            "routes": [{"name": "all", "backends": [{"service": "m"}], **(route or {})}],
        }
    )
    return translate(resolve_policy(policy))


def _manager(resources: Any) -> hcm_pb2.HttpConnectionManager:
    listener = resources.of_type(type_urls.LISTENER)["main"]
    manager = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    return manager


def test_the_orca_header_envoy_strips_is_the_one_backends_send() -> None:
    assert ORCA_HEADER == BACKEND_ORCA_HEADER
    resources = _translate({"endpoints": ["127.0.0.1:1"]})
    (vhost,) = resources.of_type(type_urls.ROUTE)["main"].virtual_hosts
    assert list(vhost.response_headers_to_remove) == [ORCA_HEADER]


def test_the_orca_trailer_is_stripped_by_a_filter_before_the_router() -> None:
    manager = _manager(_translate({"endpoints": ["127.0.0.1:1"]}))
    filters = [f.name for f in manager.http_filters]
    assert filters.index(LOAD_REPORT_FILTER) < filters.index(names.ROUTER_FILTER)
    config = header_mutation_pb2.HeaderMutation()
    manager.http_filters[filters.index(LOAD_REPORT_FILTER)].typed_config.Unpack(config)
    assert [m.remove for m in config.mutations.response_trailers_mutations] == [ORCA_HEADER]


def test_load_aware_with_zones_is_wrapped_in_wrr_locality() -> None:
    endpoints = [{"address": "127.0.0.1:1", "zone": "a"}]
    flat = _translate({"endpoints": ["127.0.0.1:1"], "load_balancing": {"policy": "load_aware"}})
    zoned = _translate({"endpoints": endpoints, "load_balancing": {"policy": "load_aware"}})
    flat_cluster = flat.of_type(type_urls.CLUSTER)["m"]
    zoned_cluster = zoned.of_type(type_urls.CLUSTER)["m"]
    assert [p.typed_extension_config.name for p in flat_cluster.load_balancing_policy.policies] == [
        CSWRR_POLICY
    ]
    (outer,) = zoned_cluster.load_balancing_policy.policies
    assert outer.typed_extension_config.name == WRR_LOCALITY_POLICY
    assert not zoned_cluster.common_lb_config.HasField("locality_weighted_lb_config")


def test_rate_limit_filter_sits_before_the_router_only_when_a_route_is_limited() -> None:
    limited = _manager(_translate({"endpoints": []}, {"rate_limit": {"requests_per_second": 5}}))
    filters = [f.name for f in limited.http_filters]
    assert filters.index(LOCAL_RATE_LIMIT_FILTER) == filters.index(names.ROUTER_FILTER) - 1
    assert len(limited.local_reply_config.mappers) == 1
    plain = _manager(_translate({"endpoints": []}))
    assert LOCAL_RATE_LIMIT_FILTER not in [f.name for f in plain.http_filters]


def test_hash_on_reaches_the_route_and_zone_weights_the_localities() -> None:
    resources = _translate(
        {
            "endpoints": [
                {"address": "127.0.0.1:1", "zone": "a", "weight": 5},
                {"address": "127.0.0.1:2", "zone": "b"},
            ],
            "load_balancing": {
                "policy": "ring_hash",
                "hash_on": {"header": "x-user"},
                "zones": {"a": 1, "b": 4},
            },
        }
    )
    (vhost,) = resources.of_type(type_urls.ROUTE)["main"].virtual_hosts
    (hash_policy,) = vhost.routes[1].route.hash_policy  # [0]: the listener's 413 route
    assert hash_policy.header.header_name == "x-user"
    assignment = resources.of_type(type_urls.ENDPOINT)["m"]
    weights = {g.locality.zone: g.load_balancing_weight.value for g in assignment.endpoints}
    assert weights == {"a": 1, "b": 4}


def test_outlier_detection_keeps_ejected_hosts_out_despite_health_checks() -> None:
    cluster = _translate({"endpoints": ["127.0.0.1:1"]}).of_type(type_urls.CLUSTER)["m"]
    detection = cluster.outlier_detection
    assert detection.successful_active_health_check_uneject_host.value is False
    assert detection.enforcing_consecutive_gateway_failure.value == 100
    assert cluster.common_lb_config.healthy_panic_threshold.value == 50.0
