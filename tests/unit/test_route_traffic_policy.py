"""Mirror, sticky hash, fault injection and cookie matches: schema rules with located
errors, the IR resolve makes of them, the Envoy config translate makes of that, and the
constant weight total a sticky split depends on."""

from __future__ import annotations

import re
from typing import Any

import pytest

from inferway._xds_protos.envoy.extensions.filters.http.fault.v3 import fault_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.policies import Policy, PolicyError, check_policy, load_policy_text
from inferway.resolve import resolve_policy
from inferway.resolve.errors import ResolveError
from inferway.resolve.ir.route import WEIGHT_TOTAL, RouteIR
from inferway.resolve.ir.route_traffic import CookieMatchIR
from inferway.resolve.weights import normalize_weights
from inferway.state import State
from inferway.xds import type_urls
from inferway.xds.translate import translate
from inferway.xds.translate.cookie_match import cookie_pattern
from inferway.xds.translate.fault import FAULT_FILTER

_HEAD = (
    "listeners: [{name: l, port: 10000}]\n"
    "services:\n"
    "  - {name: v1, endpoints: ['127.0.0.1:1']}\n"
    "  - {name: v2, endpoints: ['127.0.0.1:2']}\n"
    "routes:\n"
    "  - name: r\n"
    "    backends: [{service: v1, weight: 99}, {service: v2, weight: 1}]\n"
)


def _policy(**route: Any) -> Policy:
    return Policy.model_validate(
        {
            "listeners": [{"name": "l", "port": 10000}],
            "services": [
                {"name": "v1", "endpoints": ["127.0.0.1:1"]},
                {"name": "v2", "endpoints": ["127.0.0.1:2"]},
            ],
            "routes": [
                {
                    "name": "r",
                    "backends": [{"service": "v1", "weight": 99}, {"service": "v2", "weight": 1}],
                    **route,
                }
            ],
        }
    )


def _route_ir(policy: Policy) -> RouteIR:
    return resolve_policy(policy, State()).listeners[0].routes[0]


def _route_proto(policy: Policy) -> Any:
    config = translate(resolve_policy(policy, State())).of_type(type_urls.ROUTE)["l"]
    # the listener's own first route answers 413 to a body over its limit
    return next(r for r in config.virtual_hosts[0].routes if not r.name.endswith("_too_large"))


# -- weights: a constant total -------------------------------------------------------------------


def test_weights_are_parts_of_a_constant_ten_thousand() -> None:
    assert normalize_weights([999, 1]) == [9990, 10]
    assert normalize_weights([1000, 0]) == [10000, 0]
    assert normalize_weights([10, 20]) == [3333, 6667]
    assert normalize_weights([1, 1, 1]) == [3334, 3333, 3333]  # ties go to the earlier one
    for weights in ([7, 13, 980], [1, 2, 3, 4, 5, 6, 7], [123456, 1], [5, 0, 5]):
        parts = normalize_weights(weights)
        assert sum(parts) == WEIGHT_TOTAL
        assert all(
            abs(p - w * WEIGHT_TOTAL / sum(weights)) < 1
            for p, w in zip(parts, weights, strict=True)
        )
    with pytest.raises(ValueError, match="add up to 0"):
        normalize_weights([0, 0])


def test_a_growing_canary_keeps_its_hash_slice() -> None:
    """Envoy maps hash % total onto the weights in order: with the total fixed, the canary's
    slice at 1% lies inside its slice at 10%."""

    def canary_slice(percent: float) -> range:
        stable, canary = normalize_weights([round((100 - percent) * 10), round(percent * 10)])
        return range(stable, stable + canary)

    small, large = canary_slice(1), canary_slice(10)
    assert set(small) <= set(large) and len(small) == 100 and len(large) == 1000


def test_an_override_that_zeroes_every_weight_is_refused() -> None:
    with pytest.raises(ResolveError, match="add up to 0"):
        resolve_policy(_policy(), State(weights={"r": {"v1": 0, "v2": 0}}))


# -- sticky -----------------------------------------------------------------------------------


def test_a_sticky_route_hashes_first_and_picks_the_cluster_by_the_hash() -> None:
    policy = _policy(hash={"header": "x-user-id"})
    ir = _route_ir(policy)
    assert ir.sticky and ir.hash_policies[0].header == "x-user-id"
    action = _route_proto(policy).route
    assert action.weighted_clusters.use_hash_policy.value is True
    assert [c.weight.value for c in action.weighted_clusters.clusters] == [9900, 100]
    assert action.hash_policy[0].header.header_name == "x-user-id"


def test_a_route_without_hash_stays_random() -> None:
    action = _route_proto(_policy()).route
    assert not action.weighted_clusters.HasField("use_hash_policy")
    assert not action.hash_policy


# -- mirror -----------------------------------------------------------------------------------


def test_mirror_becomes_a_mirror_policy_in_parts_of_a_million() -> None:
    policy = _policy(mirror={"service": "v2", "percent": 12.5})
    assert _route_ir(policy).mirror is not None
    (mirror,) = _route_proto(policy).route.request_mirror_policies
    assert mirror.cluster == "v2"
    assert mirror.runtime_fraction.default_value.numerator == 125_000
    assert mirror.runtime_fraction.default_value.denominator == 2  # MILLION


def test_mirror_to_an_unknown_service_is_located() -> None:
    text = _HEAD + "    mirror: {service: v3, percent: 5}\n"
    with pytest.raises(PolicyError, match=r":8:.*unknown service 'v3'.*known: v1, v2"):
        load_policy_text(text)


def test_mirror_to_the_only_backend_is_refused() -> None:
    policy = Policy.model_validate(
        {
            "listeners": [{"name": "l", "port": 10000}],
            "services": [{"name": "v1", "endpoints": ["127.0.0.1:1"]}],
            "routes": [{"name": "r", "backends": [{"service": "v1"}], "mirror": {"service": "v1"}}],
        }
    )
    [(loc, message)] = check_policy(policy)
    assert loc == ("routes", 0, "mirror", "service")
    assert "only backend" in message


@pytest.mark.parametrize(
    ("mirror", "expected"),
    [
        ("{service: v2, percent: 101}", "must be at most 100.0, got 101"),
        ("{service: v2, percent: 0.00001}", "parts of a million"),
        ("{service: v2, share: 5}", "unknown key 'share'; allowed keys: service, percent"),
    ],
)
def test_bad_mirror_settings_are_located(mirror: str, expected: str) -> None:
    with pytest.raises(PolicyError, match=rf":8:.*{re.escape(expected)}"):
        load_policy_text(_HEAD + f"    mirror: {mirror}\n")


# -- fault ------------------------------------------------------------------------------------


def test_fault_is_a_per_route_config_of_a_listener_wide_empty_filter() -> None:
    policy = _policy(
        fault={"abort": {"percent": 5, "status": 502}, "delay": {"percent": 1, "duration": 0.1}}
    )
    assert _route_ir(policy).fault is not None
    resources = translate(resolve_policy(policy, State()))
    (listener,) = resources.of_type(type_urls.LISTENER).values()
    manager = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    names = [f.name for f in manager.http_filters]
    assert names.index(FAULT_FILTER) == names.index("envoy.filters.http.router") - 1
    per_route = fault_pb2.HTTPFault()
    _route_proto(policy).typed_per_filter_config[FAULT_FILTER].Unpack(per_route)
    assert (per_route.abort.http_status, per_route.abort.percentage.numerator) == (502, 50_000)
    assert per_route.delay.percentage.numerator == 10_000


def test_a_listener_without_faults_has_no_fault_filter() -> None:
    resources = translate(resolve_policy(_policy(), State()))
    assert FAULT_FILTER not in str(resources.of_type(type_urls.LISTENER))


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("{}", "give abort, delay or both"),
        ("{abort: {percent: 5, status: 99}}", "fault.abort.status: must be at least 200, got 99"),
        ("{delay: {percent: 5}}", "missing required field 'duration'"),
        (
            "{delay: {percent: 5, duration: 0}}",
            "duration: must be more than 0.0, got 0",
        ),
        ("{abort: {percent: -1}}", "fault.abort.percent: must be at least 0.0, got -1"),
    ],
)
def test_bad_fault_settings_are_located(fault: str, expected: str) -> None:
    with pytest.raises(PolicyError, match=rf":8:.*{re.escape(expected)}"):
        load_policy_text(_HEAD + f"    fault: {fault}\n")


# -- cookies ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        ("canary=true", True),
        ("a=1; canary=true", True),
        ("a=1;canary=true; b=2", True),
        ("canary=truex", False),
        ("xcanary=true", False),
        ("canary=false", False),
        ("a=canary=true", False),
        ("", False),
    ],
)
def test_a_cookie_match_finds_the_cookie_by_name_and_value(header: str, matches: bool) -> None:
    pattern = cookie_pattern(CookieMatchIR(name="canary", exact="true"))
    assert bool(re.fullmatch(pattern, header)) is matches


def test_a_present_cookie_match_ignores_the_value() -> None:
    pattern = cookie_pattern(CookieMatchIR(name="opt-out", present=True))
    assert re.fullmatch(pattern, "x=1; opt-out=")
    assert not re.fullmatch(pattern, "x=1; opt-outs=1")


def test_a_cookie_route_is_not_a_catch_all() -> None:
    policy = Policy.model_validate(
        {
            "listeners": [{"name": "l", "port": 10000}],
            "services": [{"name": "v1", "endpoints": ["127.0.0.1:1"]}],
            "routes": [
                {
                    "name": "forced",
                    "match": {"cookies": [{"name": "c", "exact": "1"}]},
                    "backends": [{"service": "v1"}],
                },
                {"name": "rest", "backends": [{"service": "v1"}]},
            ],
        }
    )
    assert check_policy(policy) == []


@pytest.mark.parametrize(
    ("cookie", "expected"),
    [
        ("{name: c}", "exactly one of exact or present"),
        ("{name: 'a b', exact: x}", "invalid cookie name 'a b'"),
        ("{name: c, exact: 'a;b'}", "cannot hold"),
    ],
)
def test_bad_cookie_matches_are_located(cookie: str, expected: str) -> None:
    text = _HEAD + f"    match: {{cookies: [{cookie}]}}\n"
    with pytest.raises(PolicyError, match=rf":8:.*{re.escape(expected)}"):
        load_policy_text(text)


@pytest.mark.parametrize(
    ("what", "setting"),
    [
        ("mirror", {"service": "v2"}),
        ("fault", {"abort": {"percent": 1}}),
        ("hash", {"header": "x-user-id"}),
    ],
)
def test_a_grpc_target_may_not_reach_a_route_with_envoy_only_tools(
    what: str, setting: dict[str, Any]
) -> None:
    """A proxyless client calls the backends directly: it would bypass all three."""
    policy = Policy.model_validate(
        {
            "listeners": [{"name": "l", "port": 10000}],
            "services": [
                {"name": "v1", "protocol": "http2", "endpoints": ["127.0.0.1:1"]},
                {"name": "v2", "protocol": "http2", "endpoints": ["127.0.0.1:2"]},
            ],
            "routes": [
                {
                    "name": "r",
                    "backends": [{"service": "v1", "weight": 99}, {"service": "v2", "weight": 1}],
                    what: setting,
                }
            ],
            "grpc_targets": [{"name": "models", "route": "r"}],
        }
    )
    [(loc, message)] = check_policy(policy)
    assert loc == ("grpc_targets", 0, "route")
    assert f"has {what}, which only Envoy applies" in message
