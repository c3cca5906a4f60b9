"""``grpc_targets`` in the policy: the schema, and the located errors for targets a proxyless
gRPC client could not use as the policy means them."""

from __future__ import annotations

import textwrap

import pytest

from inferway.policies import load_policy_text
from inferway.policies.errors import PolicyError

HEAD = """\
listeners:
  - name: main
    port: 10000
services:
  - name: model-v1
    protocol: http2
    endpoints: [127.0.0.1:9001]
  - name: web
    endpoints: [127.0.0.1:9002]
  - name: secure
    protocol: http2
    endpoints: [127.0.0.1:9003]
    tls: {mode: tls, ca: ca.pem}
  - name: named
    protocol: http2
    endpoints: [localhost:9004]
routes:
  - name: guarded
    match: {path: {prefix: /guarded}}
    backends: [{service: model-v1}]
    rate_limit: {requests_per_second: 5}
  - name: infer
    backends: [{service: model-v1}]
"""
FIRST_TARGET_LINE = HEAD.count("\n") + 2
"""The line of grpc_targets[0] (after HEAD and the ``grpc_targets:`` key)."""


def _errors(targets: str) -> list[str]:
    text = HEAD + "grpc_targets:\n" + textwrap.indent(textwrap.dedent(targets), "  ")
    with pytest.raises(PolicyError) as refused:
        load_policy_text(text, "policy.yaml")
    return [str(issue) for issue in refused.value.issues]


def test_a_route_and_a_service_target_load() -> None:
    text = (
        HEAD
        + "grpc_targets:\n  - {name: models, route: infer}\n  - {name: v1, service: model-v1}\n"
    )
    policy = load_policy_text(text, "policy.yaml")
    assert [(t.name, t.route, t.service) for t in policy.grpc_targets] == [
        ("models", "infer", None),
        ("v1", None, "model-v1"),
    ]


def test_a_target_names_exactly_one_of_route_or_service() -> None:
    (error,) = _errors("- {name: models, route: infer, service: model-v1}\n")
    assert error.startswith(f"policy.yaml:{FIRST_TARGET_LINE}:5: grpc_targets[0]")
    assert "exactly one of route or service (got route, service)" in error


def test_unknown_route_and_service_are_located_with_a_suggestion() -> None:
    route, service = _errors("- {name: a, route: infre}\n- {name: b, service: model-v2}\n")
    assert (
        route.startswith(f"policy.yaml:{FIRST_TARGET_LINE}:") and "grpc_targets[0].route" in route
    )
    assert "unknown route 'infre' (did you mean 'infer'?)" in route
    assert "grpc_targets[1].service" in service
    assert "unknown service 'model-v2' (did you mean 'model-v1'?)" in service


def test_duplicate_target_names_point_at_the_later_one() -> None:
    (error,) = _errors("- {name: models, route: infer}\n- {name: models, service: model-v1}\n")
    assert "grpc_targets[1].name" in error and "also grpc_targets[0]" in error


def test_what_only_envoy_enforces_or_speaks_is_refused_on_a_target() -> None:
    errors = _errors(
        """\
        - {name: a, route: guarded}
        - {name: b, service: web}
        - {name: c, service: secure}
        - {name: d, service: named}
        """
    )
    assert len(errors) == 4, errors
    guarded, web, secure, named = errors
    assert "grpc_targets[0].route" in guarded and "rate_limit, which only Envoy applies" in guarded
    assert "grpc_targets[1].service" in web and "protocol: http2" in web
    assert "upstream tls" in secure
    assert "hostname 'localhost'" in named and "IP addresses only" in named


def test_a_target_name_must_be_a_plain_name() -> None:
    (error,) = _errors("- {name: 'Models/x', route: infer}\n")
    assert "grpc_targets[0].name" in error
