"""The access-rule schema, its semantic check, redact_headers, and the RBAC translation."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inferway._xds_protos.envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from inferway._xds_protos.envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from inferway.policies import PolicyError, dump_policy, load_policy_text
from inferway.policies.access import Access, AccessRule
from inferway.policies.checks_access import listener_requires_client_certificate
from inferway.resolve import resolve_policy
from inferway.resolve.routes import resolve_access
from inferway.xds.resources import resources_to_yaml
from inferway.xds.translate import translate
from inferway.xds.translate.rbac import (
    DENIED_BY_RULE_POLICY,
    NOT_ALLOWED_POLICY,
    RBAC_FILTER,
    build_rbac_per_route,
)

BASE = """
version: 1
listeners: [{name: edge, port: 10000}]
services: [{name: s, endpoints: ["127.0.0.1:8000"]}]
routes:
  - name: r
    backends: [{service: s}]
"""


def with_access(access_yaml: str) -> str:
    return BASE + "    access:\n" + "".join(f"      {line}\n" for line in access_yaml.splitlines())


def issues(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, "p.yaml")
    return [str(issue) for issue in caught.value.issues]


def test_bad_cidr_is_a_located_error() -> None:
    found = issues(with_access("deny: [{source_ips: [10.0.0.300/8]}]"))
    assert len(found) == 1
    assert "p.yaml:" in found[0] and "source_ips" in found[0]
    assert "expected a CIDR" in found[0]


def test_cidr_with_host_bits_set_is_refused() -> None:
    found = issues(with_access("deny: [{source_ips: [10.0.0.1/8]}]"))
    assert "host bits set" in found[0]


def test_empty_rule_is_refused() -> None:
    found = issues(with_access("allow: [{}]"))
    assert "at least one non-empty field" in found[0]


def test_header_rule_needs_exactly_one_match_kind() -> None:
    found = issues(with_access("allow: [{headers: [{name: x-api-key, exact: a, prefix: b}]}]"))
    assert "exactly one of exact, prefix or present" in found[0]


def test_identity_rule_on_a_plain_listener_is_refused_by_the_semantic_check() -> None:
    found = issues(with_access("allow: [{identities: ['spiffe://example.org/ns/prod/*']}]"))
    assert len(found) == 1
    assert "routes[0].access.allow[0].identities" in found[0]
    assert "does not require client certificates" in found[0]


def test_mutual_tls_detection_reads_the_listener_tls_settings() -> None:
    assert not listener_requires_client_certificate(SimpleNamespace(tls=None))  # type: ignore[arg-type]
    for tls in (
        SimpleNamespace(require_client_certificate=True),
        SimpleNamespace(client_certificate="required"),
        SimpleNamespace(mode="mutual"),
    ):
        assert listener_requires_client_certificate(SimpleNamespace(tls=tls))  # type: ignore[arg-type]


def test_header_names_are_lowercased_and_redact_headers_round_trip() -> None:
    text = with_access("allow: [{headers: [{name: X-Api-Key, present: true}]}]")
    text += "redact_headers: [X-Tenant-Token, x-tenant-token]\n"
    policy = load_policy_text(text, "p.yaml")
    assert policy.redact_headers == ["x-tenant-token"]
    assert policy.routes[0].access is not None
    assert policy.routes[0].access.allow[0].headers[0].name == "x-api-key"  # type: ignore[index]
    assert load_policy_text(dump_policy(policy), "again.yaml") == policy


def test_bad_redact_header_name_is_refused() -> None:
    assert "not an HTTP header name" in issues(BASE + "redact_headers: ['x token']\n")[0]


def test_translation_deny_rules_and_not_allowed_policies() -> None:
    access = Access(
        allow=[AccessRule(identities=["spiffe://td/a", "spiffe://td/ns/*", "spiffe://*/sa/m"])],
        deny=[AccessRule(source_ips=["192.168.0.0/16"], headers=[{"name": "x-a", "exact": "1"}])],
    )
    per_route = build_rbac_per_route(resolve_access(access))  # type: ignore[arg-type]
    rules = per_route.rbac.rules
    assert rules.action == rbac_config_pb2.RBAC.Action.DENY
    assert set(rules.policies) == {DENIED_BY_RULE_POLICY, NOT_ALLOWED_POLICY}
    deny = rules.policies[DENIED_BY_RULE_POLICY].principals[0]
    assert [p.WhichOneof("identifier") for p in deny.and_ids.ids] == ["direct_remote_ip", "header"]
    not_allowed = rules.policies[NOT_ALLOWED_POLICY].principals[0].not_id
    names = [p.authenticated.principal_name for p in not_allowed.or_ids.ids]
    assert names[0].exact == "spiffe://td/a"
    assert names[1].prefix == "spiffe://td/ns/"
    assert names[2].safe_regex.regex == r"spiffe://.*/sa/m"


def test_deny_only_access_has_no_not_allowed_policy() -> None:
    access = resolve_access(Access(deny=[AccessRule(source_ips=["::1/128"])]))
    rules = build_rbac_per_route(access).rbac.rules  # type: ignore[arg-type]
    assert set(rules.policies) == {DENIED_BY_RULE_POLICY}


def test_unrestricted_policy_gets_no_rbac_filter() -> None:
    resources = translate(resolve_policy(load_policy_text(with_access("{}"), "p.yaml")))
    rendered = resources_to_yaml(resources)
    assert "envoy.filters.http.router" in rendered
    assert RBAC_FILTER not in rendered
    assert "local_reply_config" not in rendered


def test_restricted_route_gets_per_route_config() -> None:
    policy = load_policy_text(with_access("deny: [{source_ips: [127.0.0.1/32]}]"), "p.yaml")
    from inferway.xds.translate.route import build_route

    route = build_route(resolve_policy(policy).listeners[0].routes[0])
    per_route = rbac_pb2.RBACPerRoute()
    assert route.typed_per_filter_config[RBAC_FILTER].Unpack(per_route)
    assert per_route.rbac.rules.policies[DENIED_BY_RULE_POLICY].principals
