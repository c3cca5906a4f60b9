"""Traffic settings in the policy: schema rules, defaults, and the traffic semantic checks."""

from __future__ import annotations

from typing import Any

import pytest

from inferway.policies import Policy, PolicyError, check_policy, dump_policy, load_policy_text
from inferway.policies.traffic import (
    DEFAULT_HEALTH_PATH,
    HealthCheck,
    RateLimit,
)
from inferway.resolve.traffic import resolve_health_check


def _policy(service: dict[str, Any] | None = None, route: dict[str, Any] | None = None) -> Policy:
    return Policy.model_validate(
        {
            "listeners": [{"name": "main", "port": 10000}],
            "services": [{"name": "m", "endpoints": ["127.0.0.1:8081"], **(service or {})}],
            "routes": [{"name": "all", "backends": [{"service": "m"}], **(route or {})}],
        }
    )


def _messages(policy: Policy) -> list[str]:
    return [message for _, message in check_policy(policy)]


def test_http1_services_get_the_readiness_probe_and_http2_services_none_by_default() -> None:
    check = resolve_health_check("http1", None)
    assert check is not None and check.path == DEFAULT_HEALTH_PATH == "/v2/health/ready"
    assert (check.interval, check.timeout, check.no_traffic_interval) == (2.0, 1.0, 2.0)
    assert resolve_health_check("http2", None) is None
    assert resolve_health_check("http1", HealthCheck(enabled=False)) is None
    grpc = resolve_health_check("http2", HealthCheck(type="grpc", interval=0.5))
    assert grpc is not None and grpc.type == "grpc"
    assert (grpc.timeout, grpc.no_traffic_interval) == (0.5, 0.5)  # shorter interval wins


def test_rate_limit_needs_exactly_one_way_to_give_the_rate() -> None:
    assert RateLimit(requests_per_second=10).bucket_size == 10
    limit = RateLimit(tokens=5, fill_interval=0.1, burst=20)
    assert (limit.tokens_per_fill, limit.refill_seconds, limit.bucket_size) == (5, 0.1, 20)
    for bad in ({}, {"requests_per_second": 5, "tokens": 1}, {"tokens": 5}):
        with pytest.raises(ValueError, match="requests_per_second"):
            RateLimit.model_validate(bad)
    with pytest.raises(ValueError, match="burst 2 is smaller than one refill"):
        RateLimit(requests_per_second=10, burst=2)
    with pytest.raises(ValueError, match=r"greater than or equal to 0\.05"):
        RateLimit(tokens=1, fill_interval=0.01)


def test_hash_on_takes_exactly_one_key() -> None:
    text = (
        "listeners: [{name: l, port: 10000}]\n"
        "services:\n"
        "  - name: m\n"
        "    endpoints: ['127.0.0.1:1']\n"
        "    load_balancing: {policy: ring_hash, hash_on: {header: a, source_ip: true}}\n"
        "routes: [{name: r, backends: [{service: m}]}]\n"
    )
    with pytest.raises(PolicyError, match=r":5:.*exactly one of header, cookie or source_ip"):
        load_policy_text(text)


def test_circuit_breakers_refuse_max_retries_with_a_retry_budget() -> None:
    with pytest.raises(ValueError, match="max_retries or retry_budget, not both"):
        _policy({"circuit_breakers": {"max_retries": 3, "retry_budget": {}}})


def test_hash_on_without_a_hashing_policy_is_reported() -> None:
    policy = _policy({"load_balancing": {"policy": "round_robin", "hash_on": {"header": "x"}}})
    [(loc, message)] = check_policy(policy)
    assert loc == ("services", 0, "load_balancing", "hash_on")
    assert "ring_hash or maglev" in message


def test_zone_weights_must_match_the_endpoint_zones() -> None:
    endpoints = [
        {"address": "127.0.0.1:1", "zone": "a"},
        {"address": "127.0.0.1:2", "zone": "b"},
    ]
    good = _policy({"endpoints": endpoints, "load_balancing": {"zones": {"a": 80, "b": 20}}})
    assert check_policy(good) == []
    typo = _policy({"endpoints": endpoints, "load_balancing": {"zones": {"a": 80, "c": 20}}})
    messages = _messages(typo)
    assert any("no endpoint of service 'm' is in zone 'c'; its zones: a, b" in m for m in messages)
    assert any("zone(s) b of service 'm' have no weight" in m for m in messages)
    unzoned = _policy({"load_balancing": {"zones": {"a": 1}}})
    assert any("no endpoint of service 'm' has a zone" in m for m in _messages(unzoned))


def test_health_check_timeout_and_grpc_protocol_are_checked() -> None:
    slow = _policy({"health_check": {"interval": "1s", "timeout": "2s"}})
    assert any("longer than interval" in m for m in _messages(slow))
    grpc = _policy({"health_check": {"type": "grpc"}})
    assert any("gRPC health checks need an HTTP/2 service" in m for m in _messages(grpc))


def test_traffic_settings_round_trip_through_dump() -> None:
    policy = _policy(
        {
            "endpoints": [{"address": "127.0.0.1:1", "zone": "a", "priority": 0}],
            "load_balancing": {
                "policy": "maglev",
                "hash_on": {"cookie": {"name": "s", "ttl": "1h"}},
                "zones": {"a": 3},
            },
            "health_check": {"interval": "250ms", "path": "/ready"},
            "outlier_detection": {"failure_percentage": {"threshold": 50}},
            "circuit_breakers": {"max_requests": 10, "retry_budget": {"percent": 10}},
        },
        {
            "rate_limit": {"tokens": 3, "fill_interval": "200ms"},
            "retries": {"attempts": 2, "host_selection": {"avoid_previous": False}},
        },
    )
    assert check_policy(policy) == []
    assert load_policy_text(dump_policy(policy)) == policy


def test_a_zone_lies_in_one_region_and_a_region_needs_a_zone() -> None:
    endpoints = [
        {"address": "127.0.0.1:1", "zone": "a", "region": "east"},
        {"address": "127.0.0.1:2", "zone": "a", "region": "west"},
        {"address": "127.0.0.1:3", "region": "east"},
        {"address": "127.0.0.1:4", "zone": "b", "region": "east"},
    ]
    issues = check_policy(_policy({"endpoints": endpoints}))
    assert [loc for loc, _ in issues] == [
        ("services", 0, "endpoints", 1, "region"),
        ("services", 0, "endpoints", 2, "region"),
    ]
    assert "zone 'a' is in region 'east' (endpoint 0), not 'west'" in issues[0][1]
    assert "region is given without a zone" in issues[1][1]
