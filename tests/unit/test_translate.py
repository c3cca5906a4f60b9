"""Unit tests of the pure translator: policy in, Envoy protos out (no Envoy needed)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.listener.v3 import listener_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.extensions.upstreams.http.v3 import (
    http_protocol_options_pb2 as hpo_pb2,
)
from inferway.policies.model import Policy
from inferway.resolve import resolve_policy
from inferway.xds import type_urls
from inferway.xds.resources import Resources, content_hash, resources_to_yaml
from inferway.xds.translate import translate
from inferway.xds.translate.validation import build_envoy_validation_bootstrap

CANARY = """
listeners: [{name: ingress, port: 10000}]
services:
  - {name: v1, endpoints: ["127.0.0.1:8001", "127.0.0.1:8002"]}
  - {name: v2, endpoints: ["127.0.0.1:8003"]}
routes:
  - name: infer
    backends: [{service: v1, weight: 99.9}, {service: v2, weight: 0.1}]
"""


def _policy(text: str, **overrides: Any) -> Policy:
    data = yaml.safe_load(text)
    data.update(overrides)
    return Policy.model_validate(data)


def _route_config(resources: Resources, name: str = "ingress") -> route_pb2.RouteConfiguration:
    config = resources.of_type(type_urls.ROUTE)[name]
    assert isinstance(config, route_pb2.RouteConfiguration)
    return config


def _routes(resources: Resources, name: str = "ingress") -> list[Any]:
    """The policy's routes, without the listener's own first route (its 413 for a body over
    ``limits.max_request_bytes``, tests/integration/test_envoy_listener_limits.py)."""
    routes = list(_route_config(resources, name).virtual_hosts[0].routes)
    assert routes[0].name == f"{name}_too_large"
    return routes[1:]


def test_canary_weights_become_parts_of_ten_thousand() -> None:
    route = _routes(translate(resolve_policy(_policy(CANARY))))[0]
    weights = {c.name: c.weight.value for c in route.route.weighted_clusters.clusters}
    assert weights == {"v1": 9990, "v2": 10}
    assert not route.route.weighted_clusters.HasField("total_weight")


def test_translation_is_byte_identical_for_the_same_policy() -> None:
    first, second = (
        translate(resolve_policy(_policy(CANARY))),
        translate(resolve_policy(_policy(CANARY))),
    )
    assert resources_to_yaml(first) == resources_to_yaml(second)
    for type_url in first.type_urls():
        a, b = first.of_type(type_url), second.of_type(type_url)
        assert list(a) == list(b)
        assert content_hash(a.values()) == content_hash(b.values())
        assert [m.SerializeToString(deterministic=True) for m in a.values()] == [
            m.SerializeToString(deterministic=True) for m in b.values()
        ]


def test_a_different_policy_gives_different_output() -> None:
    canary = translate(resolve_policy(_policy(CANARY)))
    data = yaml.safe_load(CANARY)
    data["routes"][0]["backends"][1]["weight"] = 5
    shifted = translate(resolve_policy(Policy.model_validate(data)))
    assert resources_to_yaml(canary) != resources_to_yaml(shifted)
    routes_a = canary.of_type(type_urls.ROUTE).values()
    routes_b = shifted.of_type(type_urls.ROUTE).values()
    assert content_hash(routes_a) != content_hash(routes_b)
    # Only the route changed: clusters and endpoints keep their version.
    assert content_hash(canary.of_type(type_urls.CLUSTER).values()) == content_hash(
        shifted.of_type(type_urls.CLUSTER).values()
    )


def test_endpoint_order_in_policy_does_not_change_output() -> None:
    data = yaml.safe_load(CANARY)
    data["services"][0]["endpoints"].reverse()
    assert resources_to_yaml(
        translate(resolve_policy(Policy.model_validate(data)))
    ) == resources_to_yaml(translate(resolve_policy(_policy(CANARY))))


def test_single_backend_is_a_plain_cluster() -> None:
    policy = _policy(CANARY, routes=[{"name": "r", "backends": [{"service": "v2"}]}])
    action = _routes(translate(resolve_policy(policy)))[0].route
    assert action.cluster == "v2"
    assert not action.HasField("weighted_clusters")


def test_resource_names_follow_the_contract() -> None:
    resources = translate(resolve_policy(_policy(CANARY)))
    assert list(resources.of_type(type_urls.LISTENER)) == ["ingress"]
    assert list(resources.of_type(type_urls.ROUTE)) == ["ingress"]
    assert list(resources.of_type(type_urls.CLUSTER)) == ["v1", "v2"]
    assert list(resources.of_type(type_urls.ENDPOINT)) == ["v1", "v2"]
    listener = resources.of_type(type_urls.LISTENER)["ingress"]
    assert isinstance(listener, listener_pb2.Listener)
    manager = hcm_pb2.HttpConnectionManager()
    assert listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    assert manager.rds.route_config_name == "ingress"
    assert manager.rds.config_source.HasField("ads")
    assert manager.stat_prefix == "ingress"
    assert manager.use_remote_address.value is False
    assert manager.http_filters[-1].name == "envoy.filters.http.router"


def test_status_codes_are_retried_through_retriable_status_codes_never_bare() -> None:
    policy = _policy(
        CANARY,
        routes=[
            {
                "name": "r",
                "backends": [{"service": "v1"}],
                "retries": {
                    "attempts": 2,
                    "on": ["reset"],
                    "retriable_status_codes": [503, 502, 503],
                    "per_try_timeout": "250ms",
                },
            }
        ],
    )
    retry = _routes(translate(resolve_policy(policy)))[0].route.retry_policy
    assert retry.retry_on == "reset,retriable-status-codes"
    assert "503" not in retry.retry_on
    assert list(retry.retriable_status_codes) == [502, 503]
    assert retry.num_retries.value == 2
    assert (retry.per_try_timeout.seconds, retry.per_try_timeout.nanos) == (0, 250_000_000)
    assert retry.retry_host_predicate[0].name == "envoy.retry_host_predicates.previous_hosts"
    assert retry.host_selection_retry_max_attempts > 0


def test_header_matchers_cover_present_invert_and_regex() -> None:
    policy = _policy(
        CANARY,
        routes=[
            {
                "name": "r",
                "match": {
                    "path": {"regex": "^/v2/.*$"},
                    "headers": [
                        {"name": "x-a", "present": True, "invert": True},
                        {"name": "x-b", "regex": "b+"},
                        {"name": "x-c", "prefix": "c"},
                    ],
                },
                "backends": [{"service": "v1"}],
            }
        ],
    )
    match = _routes(translate(resolve_policy(policy)))[0].match
    assert match.safe_regex.regex == "^/v2/.*$"
    a, b, c = match.headers
    assert a.present_match and a.invert_match
    assert b.string_match.safe_regex.regex == "b+" and not b.invert_match
    assert c.string_match.prefix == "c"


def test_routes_are_served_only_on_their_listeners_in_policy_order() -> None:
    policy = _policy(
        CANARY,
        listeners=[{"name": "a", "port": 1}, {"name": "b", "port": 2}],
        routes=[
            {"name": "only-b", "listeners": ["b"], "backends": [{"service": "v1"}]},
            {"name": "both", "backends": [{"service": "v1"}]},
            {"name": "only-a", "listeners": ["a"], "backends": [{"service": "v1"}]},
        ],
    )
    resources = translate(resolve_policy(policy))
    assert [r.name for r in _routes(resources, "a")] == ["both", "only-a"]
    assert [r.name for r in _routes(resources, "b")] == ["only-b", "both"]


def test_zones_give_locality_weights_and_locality_weighted_lb() -> None:
    policy = _policy(
        CANARY,
        services=[
            {
                "name": "v1",
                "endpoints": [
                    {"host": "10.0.0.2", "port": 80, "zone": "b", "weight": 4},
                    {"host": "10.0.0.1", "port": 80, "zone": "a", "weight": 2},
                    {"host": "10.0.0.3", "port": 80, "zone": "a", "weight": 3},
                    {"host": "10.0.0.9", "port": 80, "zone": "a", "priority": 1},
                ],
            },
            {"name": "v2"},
        ],
    )
    resources = translate(resolve_policy(policy))
    assignment = resources.of_type(type_urls.ENDPOINT)["v1"]
    summary = [
        (g.priority, g.locality.zone, g.load_balancing_weight.value, len(g.lb_endpoints))
        for g in assignment.endpoints  # type: ignore[attr-defined]
    ]
    assert summary == [(0, "a", 5, 2), (0, "b", 4, 1), (1, "a", 1, 1)]
    cluster = resources.of_type(type_urls.CLUSTER)["v1"]
    assert cluster.common_lb_config.HasField("locality_weighted_lb_config")  # type: ignore[attr-defined]
    empty = resources.of_type(type_urls.ENDPOINT)["v2"]
    assert empty.cluster_name == "v2" and len(empty.endpoints) == 0  # type: ignore[attr-defined]
    plain = resources.of_type(type_urls.CLUSTER)["v2"]
    assert not plain.common_lb_config.HasField("locality_weighted_lb_config")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("protocol", "field"), [("http2", "http2_protocol_options"), ("http1", "http_protocol_options")]
)
def test_upstream_protocol_is_explicit(protocol: str, field: str) -> None:
    policy = _policy(CANARY, services=[{"name": "v1", "protocol": protocol}, {"name": "v2"}])
    cluster = translate(resolve_policy(policy)).of_type(type_urls.CLUSTER)["v1"]
    assert isinstance(cluster, cluster_pb2.Cluster)
    assert cluster.type == cluster_pb2.Cluster.DiscoveryType.EDS
    options = hpo_pb2.HttpProtocolOptions()
    key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    assert cluster.typed_extension_protocol_options[key].Unpack(options)
    assert options.explicit_http_config.WhichOneof("protocol_config") == field


def test_validation_bootstrap_inlines_routes_and_endpoints() -> None:
    policy = _policy(
        CANARY,
        services=[{"name": "v1", "endpoints": ["model.internal:80"]}, {"name": "v2"}],
    )
    bootstrap = build_envoy_validation_bootstrap(translate(resolve_policy(policy)))
    assert bootstrap["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    clusters = {c["name"]: c for c in bootstrap["static_resources"]["clusters"]}
    assert clusters["v1"]["type"] == "STRICT_DNS"
    assert clusters["v2"]["type"] == "STATIC"
    assert "eds_cluster_config" not in clusters["v1"]
    assert clusters["v1"]["load_assignment"]["cluster_name"] == "v1"
    (listener,) = bootstrap["static_resources"]["listeners"]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert "rds" not in manager
    assert manager["route_config"]["name"] == "ingress"
    assert yaml.safe_load(yaml.safe_dump(bootstrap)) == bootstrap


def test_validation_bootstrap_names_a_missing_route_configuration() -> None:
    resources = translate(resolve_policy(_policy(CANARY)))
    without_routes = Resources.build(
        {
            t: list(resources.of_type(t).items())
            for t in resources.type_urls()
            if t != type_urls.ROUTE
        }
    )
    with pytest.raises(ValueError, match="listener 'ingress' uses route configuration 'ingress'"):
        build_envoy_validation_bootstrap(without_routes)


def test_hostname_endpoints_make_a_dns_cluster_without_eds() -> None:
    policy = _policy(
        CANARY, services=[{"name": "v1", "endpoints": ["localhost:8000"]}, {"name": "v2"}]
    )
    resources = translate(resolve_policy(policy))
    cluster = resources.of_type(type_urls.CLUSTER)["v1"]
    assert isinstance(cluster, cluster_pb2.Cluster)
    assert cluster.type == cluster_pb2.Cluster.DiscoveryType.STRICT_DNS
    assert cluster.dns_lookup_family == cluster_pb2.Cluster.DnsLookupFamily.V4_PREFERRED
    assert not cluster.HasField("eds_cluster_config")
    address = cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint.address
    assert address.socket_address.address == "localhost"
    assert list(resources.of_type(type_urls.ENDPOINT)) == ["v2"]
