"""Semantic checks as a pure function over a Policy: each rule, on its own."""

from __future__ import annotations

from typing import Any

from inferway.policies import Policy, check_policy


def _policy(**overrides: Any) -> Policy:
    data: dict[str, Any] = {
        "listeners": [{"name": "main", "port": 10000}],
        "services": [
            {"name": "v1", "endpoints": ["127.0.0.1:8081"]},
            {"name": "v2", "endpoints": ["127.0.0.1:8082"]},
        ],
        "routes": [{"name": "all", "backends": [{"service": "v1"}]}],
    }
    data.update(overrides)
    return Policy.model_validate(data)


def _locs(policy: Policy) -> list[tuple[Any, ...]]:
    return [loc for loc, _ in check_policy(policy)]


def test_a_sensible_policy_has_no_issues() -> None:
    assert check_policy(_policy()) == []


def test_unknown_service_lists_the_known_ones() -> None:
    policy = _policy(routes=[{"name": "r", "backends": [{"service": "v3"}]}])
    [(loc, message)] = check_policy(policy)
    assert loc == ("routes", 0, "backends", 0, "service")
    assert "unknown service 'v3'" in message and "known: v1, v2" in message


def test_duplicate_names_point_at_the_later_one() -> None:
    policy = _policy(
        listeners=[{"name": "a", "port": 1}, {"name": "a", "port": 2}],
        services=[{"name": "v1", "endpoints": ["127.0.0.1:1"]}] * 2,
    )
    assert _locs(policy) == [("listeners", 1, "name"), ("services", 1, "name")]


def test_wildcard_address_clashes_with_a_specific_one_on_the_same_port() -> None:
    policy = _policy(
        listeners=[
            {"name": "a", "address": "127.0.0.1", "port": 80},
            {"name": "b", "address": "0.0.0.0", "port": 80},
            {"name": "c", "address": "::", "port": 81},
            {"name": "d", "address": "::1", "port": 81},
        ]
    )
    assert _locs(policy) == [("listeners", 1, "port"), ("listeners", 3, "port")]


def test_different_ports_or_families_do_not_clash() -> None:
    policy = _policy(
        listeners=[
            {"name": "a", "address": "127.0.0.1", "port": 80},
            {"name": "b", "address": "127.0.0.2", "port": 80},
            {"name": "c", "address": "::", "port": 80},
            {"name": "d", "address": "127.0.0.1", "port": 81},
        ]
    )
    assert check_policy(policy) == []


def test_route_naming_an_unknown_listener_suggests_the_close_one() -> None:
    policy = _policy(routes=[{"name": "r", "listeners": ["mian"], "backends": [{"service": "v1"}]}])
    [(loc, message)] = check_policy(policy)
    assert loc == ("routes", 0, "listeners", 0)
    assert "did you mean 'main'?" in message


def test_all_zero_weights_are_refused_but_one_zero_is_fine() -> None:
    zero = [{"service": "v1", "weight": 0}, {"service": "v2", "weight": 0}]
    assert _locs(_policy(routes=[{"name": "r", "backends": zero}])) == [("routes", 0, "backends")]
    some = [{"service": "v1", "weight": 100}, {"service": "v2", "weight": 0}]
    assert check_policy(_policy(routes=[{"name": "r", "backends": some}])) == []


def test_weights_beyond_envoys_uint32_total_are_refused() -> None:
    huge = [{"service": "v1", "weight": 3e8}, {"service": "v2", "weight": 3e8}]
    [(loc, message)] = check_policy(_policy(routes=[{"name": "r", "backends": huge}]))
    assert loc == ("routes", 0, "backends") and "relative" in message


def test_service_without_endpoints_may_only_get_zero_weight() -> None:
    services = [{"name": "v1", "endpoints": ["127.0.0.1:1"]}, {"name": "v2"}]
    hot = [{"service": "v1", "weight": 90}, {"service": "v2", "weight": 10}]
    cold = [{"service": "v1", "weight": 100}, {"service": "v2", "weight": 0}]
    assert _locs(_policy(services=services, routes=[{"name": "r", "backends": hot}])) == [
        ("routes", 0, "backends", 1, "weight")
    ]
    assert check_policy(_policy(services=services, routes=[{"name": "r", "backends": cold}])) == []


def test_same_service_twice_in_one_route_is_refused() -> None:
    twice = [{"service": "v1", "weight": 50}, {"service": "v1", "weight": 50}]
    assert _locs(_policy(routes=[{"name": "r", "backends": twice}])) == [
        ("routes", 0, "backends", 1, "service")
    ]


def test_duplicate_endpoint_is_refused() -> None:
    services = [{"name": "v1", "endpoints": ["127.0.0.1:1", {"host": "127.0.0.1", "port": 1}]}]
    assert _locs(_policy(services=services)) == [("services", 0, "endpoints", 1)]


def test_retriable_status_codes_need_each_other() -> None:
    routes = [
        {
            "name": "a",
            "backends": [{"service": "v1"}],
            "match": {"path": {"prefix": "/a"}},
            "retries": {"on": ["retriable-status-codes"]},
        },
        {
            "name": "b",
            "backends": [{"service": "v1"}],
            "match": {"path": {"prefix": "/b"}},
            "retries": {"on": ["5xx"], "retriable_status_codes": [503]},
        },
        {
            "name": "c",
            "backends": [{"service": "v1"}],
            "retries": {"on": ["retriable-status-codes"], "retriable_status_codes": [503]},
        },
    ]
    assert _locs(_policy(routes=routes)) == [
        ("routes", 0, "retries", "retriable_status_codes"),
        ("routes", 1, "retries", "on"),
    ]


def test_per_try_timeout_longer_than_the_route_timeout_is_refused() -> None:
    def route(per_try: str, timeout: str) -> dict[str, Any]:
        return {
            "name": "r",
            "backends": [{"service": "v1"}],
            "timeout": timeout,
            "retries": {"per_try_timeout": per_try},
        }

    assert _locs(_policy(routes=[route("3s", "2s")])) == [
        ("routes", 0, "retries", "per_try_timeout")
    ]
    assert check_policy(_policy(routes=[route("2s", "2s")])) == []
    assert check_policy(_policy(routes=[route("3s", "0s")])) == []  # 0: no route timeout


def test_route_after_a_catch_all_on_the_same_listener_is_shadowed() -> None:
    routes = [
        {"name": "default", "backends": [{"service": "v1"}]},
        {
            "name": "forced",
            "backends": [{"service": "v2"}],
            "match": {"headers": [{"name": "x-canary", "exact": "true"}]},
        },
    ]
    [(loc, message)] = check_policy(_policy(routes=routes))
    assert loc == ("routes", 1)
    assert "route 'default' (routes[0])" in message


def test_catch_all_on_another_listener_or_with_headers_shadows_nothing() -> None:
    listeners = [{"name": "a", "port": 1}, {"name": "b", "port": 2}]
    routes = [
        {
            "name": "forced",
            "backends": [{"service": "v2"}],
            "match": {"headers": [{"name": "x-canary", "exact": "true"}]},
        },
        {"name": "only-a", "listeners": ["a"], "backends": [{"service": "v1"}]},
        {"name": "only-b", "listeners": ["b"], "backends": [{"service": "v2"}]},
    ]
    assert check_policy(_policy(listeners=listeners, routes=routes)) == []


def test_empty_listener_list_is_refused() -> None:
    routes = [{"name": "r", "listeners": [], "backends": [{"service": "v1"}]}]
    assert _locs(_policy(routes=routes)) == [("routes", 0, "listeners")]


def test_service_names_of_inferways_own_clusters_are_reserved() -> None:
    services = [{"name": "inferway_otel_collector", "endpoints": ["127.0.0.1:8081"]}]
    routes = [{"name": "all", "backends": [{"service": "inferway_otel_collector"}]}]
    [(loc, message)] = check_policy(_policy(services=services, routes=routes))
    assert loc == ("services", 0, "name")
    assert "'inferway_otel_collector' is reserved" in message


def test_every_internal_cluster_name_has_the_reserved_prefix() -> None:
    from inferway.policies.types import RESERVED_NAME_PREFIX
    from inferway.xds.bootstrap import XDS_CLUSTER_NAME
    from inferway.xds.translate.tracing import COLLECTOR_CLUSTER

    for name in (XDS_CLUSTER_NAME, COLLECTOR_CLUSTER):
        assert name.startswith(RESERVED_NAME_PREFIX)
