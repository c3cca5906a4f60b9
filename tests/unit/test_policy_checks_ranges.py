"""What Envoy would refuse although the schema accepts it: RE2 regexes, proto ranges; where a
refusal Envoy printed points back into the policy; listener ports this machine cannot bind."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from inferway.policies import Policy, PolicyError, check_policy, load_policy_text
from inferway.policies.checks_bind import check_listeners_bindable, listener_bind_issues
from inferway.policies.checks_envoy import locate_envoy_message
from inferway.policies.checks_ranges import check_regex


def _policy(**overrides: Any) -> Policy:
    data: dict[str, Any] = {
        "listeners": [{"name": "main", "port": 10000}],
        "services": [{"name": "v1", "endpoints": ["127.0.0.1:8081"]}],
        "routes": [{"name": "all", "backends": [{"service": "v1"}]}],
    }
    data.update(overrides)
    return Policy.model_validate(data)


def _route(match: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": "all", "match": match, "backends": [{"service": "v1"}]}]


def test_re2_accepts_what_envoy_accepts_and_names_what_it_refuses() -> None:
    assert check_regex("^/v[0-9]+/models/.*$") is None
    assert check_regex("tr(ue") == "missing ): tr(ue"
    assert "invalid perl operator" in (check_regex("(?=lookahead)") or "")  # Python re allows it


def test_a_header_regex_envoy_refuses_is_a_located_issue_with_re2s_reason() -> None:
    text = (
        "listeners: [{name: main, port: 10000}]\n"
        'services: [{name: v1, endpoints: ["127.0.0.1:8081"]}]\n'
        "routes:\n"
        "  - name: all\n"
        "    match:\n"
        "      headers:\n"
        "        - name: x-flag\n"
        '          regex: "tr(ue"\n'
        "    backends: [{service: v1}]\n"
    )
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    (issue,) = caught.value.issues
    assert (issue.line, issue.path) == (8, "routes[0].match.headers[0].regex")
    assert "missing ): tr(ue" in issue.message and "RE2" in issue.message


def test_a_path_regex_is_checked_too_and_a_good_one_passes() -> None:
    bad = _policy(routes=_route({"path": {"regex": "/v(1"}}))
    assert [loc for loc, _ in check_policy(bad)] == [("routes", 0, "match", "path", "regex")]
    assert check_policy(_policy(routes=_route({"path": {"regex": "/v(1|2)/.*"}}))) == []


def test_integers_and_durations_must_fit_envoys_fields() -> None:
    policy = _policy(
        services=[
            {
                "name": "v1",
                "endpoints": ["127.0.0.1:8081"],
                "connect_timeout": "0s",
                "health_check": {"path": "/ready", "unhealthy_threshold": 2**32},
            }
        ],
        routes=[{"name": "all", "timeout": 4e11, "backends": [{"service": "v1"}]}],
    )
    issues = dict(check_policy(policy))
    assert "more than 0 s" in issues[("services", 0, "connect_timeout")]
    assert "32 bits" in issues[("services", 0, "health_check", "unhealthy_threshold")]
    assert "at most 315576000000 seconds" in issues[("routes", 0, "timeout")]


def test_envoys_proto_error_points_at_the_policy_field() -> None:
    policy = _policy(
        routes=_route({"path": {"prefix": "/"}, "headers": [{"name": "x\nflag", "exact": "on"}]})
    )
    message = (
        "Proto constraint validation failed: HeaderMatcherValidationError.Name: value does not "
        'match regex pattern "^[^\\x00\\n\\r]*$"'
    )
    assert locate_envoy_message(policy, message) == [("routes", 0, "match", "headers", 0, "name")]


def test_envoys_message_naming_a_cluster_points_at_that_service() -> None:
    policy = _policy()
    message = "Error adding/updating cluster(s) v1: something Envoy dislikes"
    assert locate_envoy_message(policy, message) == [("services", 0, "name")]
    assert locate_envoy_message(policy, "no clue here") == []


def test_a_port_another_process_listens_on_is_a_located_issue() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        text = (
            f"listeners:\n  - name: main\n    port: {port}\n"
            'services: [{name: v1, endpoints: ["127.0.0.1:8081"]}]\n'
            "routes: [{name: all, backends: [{service: v1}]}]\n"
        )
        policy = load_policy_text(text, "p.yaml")
        (issue,) = listener_bind_issues(policy, text, "p.yaml")
        assert (issue.file, issue.line, issue.path) == ("p.yaml", 3, "listeners[0].port")
        assert f"cannot bind 127.0.0.1:{port}" in issue.message
    assert list(check_listeners_bindable(policy)) == []  # free again


async def test_run_refuses_a_listener_port_in_use_before_starting_anything(tmp_path) -> None:
    from inferway.gateway.runtime import GatewayOptions, start_gateway

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        path = tmp_path / "policy.yaml"
        path.write_text(
            f"listeners:\n  - name: main\n    port: {port}\n"
            'services: [{name: v1, endpoints: ["127.0.0.1:8081"]}]\n'
            "routes: [{name: all, backends: [{service: v1}]}]\n"
        )
        with pytest.raises(PolicyError) as caught:
            await start_gateway(GatewayOptions(policy_path=path, xds_port=0, admin_port=0))
    (issue,) = caught.value.issues
    assert (issue.line, issue.path) == (3, "listeners[0].port")
    assert "cannot bind" in issue.message
