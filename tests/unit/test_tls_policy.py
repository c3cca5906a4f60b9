"""TLS in the policy and the translator: what each mode needs, SDS references, identity
matchers, and certificate files turned into secrets (or refused with a message to act on)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferway._xds_protos.envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from inferway._xds_protos.envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from inferway.gateway.cert_watcher import CertificateSource, load_tls_secrets
from inferway.gateway.control_plane import ControlPlane
from inferway.gateway.watcher import PolicyWatcher
from inferway.pki.bundle_files import write_bundle
from inferway.pki.mint import build_ca, build_certificate
from inferway.policies import PolicyError, load_policy_text
from inferway.resolve import resolve_policy
from inferway.state import State, TlsMaterial
from inferway.xds import type_urls
from inferway.xds.cache import SnapshotCache
from inferway.xds.resources import resources_to_yaml
from inferway.xds.translate import translate
from inferway.xds.translate.listener import build_http_connection_manager
from inferway.xds.translate.rate_limit import RATE_LIMITED_BODY
from inferway.xds.translate.rbac import FORBIDDEN_BODY
from inferway.xds.translate.tls import (
    IDENTITY_DENIED_DETAILS,
    IDENTITY_FILTER,
    build_identity_matcher,
)

MUTUAL = """
version: 1
listeners:
  - name: secure
    port: 10443
    tls:
      mode: mutual
      certificate: certs/server.pem
      private_key: certs/server-key.pem
      client_ca: certs/ca.pem
      min_version: 1.3
      allowed_identities: ["spiffe://inferway.local/ns/default/sa/client"]
services:
  - name: model
    endpoints: ["127.0.0.1:8000"]
    tls: {ca: certs/ca.pem}
routes:
  - name: all
    backends: [{service: model}]
"""


def _issues(text: str) -> list[str]:
    with pytest.raises(PolicyError) as error:
        load_policy_text(text, "p.yaml")
    return [f"{i.path}: {i.message}" for i in error.value.issues]


def test_each_mode_names_the_files_it_needs() -> None:
    text = MUTUAL.replace("      client_ca: certs/ca.pem\n", "")
    assert any("needs 'client_ca'" in i for i in _issues(text))
    text = MUTUAL.replace("tls: {ca: certs/ca.pem}", "tls: {mode: mutual, ca: certs/ca.pem}")
    issues = _issues(text)
    assert any("needs 'certificate'" in i for i in issues)
    assert any("needs 'private_key'" in i for i in issues)


def test_settings_a_mode_ignores_are_refused() -> None:
    text = MUTUAL.replace("mode: mutual", "mode: tls")
    issues = _issues(text)
    assert any("'client_ca' has no effect in mode 'tls'" in i for i in issues)
    assert any("'allowed_identities' has no effect" in i for i in issues)


def test_min_version_only_1_2_or_1_3() -> None:
    assert any("min_version" in i for i in _issues(MUTUAL.replace("1.3", '"1.1"')))


def test_listener_and_cluster_refer_to_sds_secrets_and_identity_is_rbac() -> None:
    policy = load_policy_text(MUTUAL)
    material = {
        "listener/secure/cert": TlsMaterial(certificate_chain=b"C", private_key=b"K"),
        "listener/secure/ca": TlsMaterial(trusted_ca=b"A"),
        "service/model/ca": TlsMaterial(trusted_ca=b"A"),
        "listener/gone/cert": TlsMaterial(certificate_chain=b"C", private_key=b"K"),
    }
    resources = translate(resolve_policy(policy, State(secrets=material)))
    # Unreferenced material is not sent.
    assert sorted(resources.of_type(type_urls.SECRET)) == [
        "listener/secure/ca",
        "listener/secure/cert",
        "service/model/ca",
    ]
    listener = resources.of_type(type_urls.LISTENER)["secure"]
    context = tls_pb2.DownstreamTlsContext()
    listener.filter_chains[0].transport_socket.typed_config.Unpack(context)  # type: ignore[attr-defined]
    common = context.common_tls_context
    assert context.require_client_certificate.value is True
    assert [c.name for c in common.tls_certificate_sds_secret_configs] == ["listener/secure/cert"]
    assert common.validation_context_sds_secret_config.name == "listener/secure/ca"
    assert common.validation_context_sds_secret_config.sds_config.HasField("ads")
    assert common.tls_params.tls_minimum_protocol_version == 4  # TLSv1_3
    manager = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)  # type: ignore[attr-defined]
    assert manager.http_filters[0].name == IDENTITY_FILTER
    rbac = rbac_pb2.RBAC()
    manager.http_filters[0].typed_config.Unpack(rbac)
    assert rbac.rules.action == rbac_config_pb2.RBAC.Action.DENY  # names its policy on refusal
    (policy_rule,) = rbac.rules.policies.values()
    allowed = policy_rule.principals[0].not_id.or_ids.ids
    assert allowed[0].authenticated.principal_name.exact == (
        "spiffe://inferway.local/ns/default/sa/client"
    )
    # Keys never reach rendered YAML.
    rendered = resources_to_yaml(resources)
    assert "<redacted>" in rendered and "Sw==" not in rendered  # base64 of b"K"


@pytest.mark.parametrize(
    "pattern, kind, value",
    [
        ("spiffe://td/ns/a/sa/b", "exact", "spiffe://td/ns/a/sa/b"),
        ("spiffe://td/ns/a/sa/*", "prefix", "spiffe://td/ns/a/sa/"),
        ("spiffe://td/ns/*/sa/b", "safe_regex", r"spiffe://td/ns/.*/sa/b"),
        ("*.example.com", "safe_regex", r".*\.example\.com"),
    ],
)
def test_identity_patterns(pattern: str, kind: str, value: str) -> None:
    matcher = build_identity_matcher(pattern)
    assert matcher.WhichOneof("match_pattern") == kind
    got = matcher.safe_regex.regex if kind == "safe_regex" else getattr(matcher, kind)
    assert got == value


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    ca = build_ca()
    server = build_certificate(ca, dns_names=["localhost"], server=True)
    write_bundle(tmp_path / "certs", "ca", ca)
    write_bundle(tmp_path / "certs", "server", server)
    (tmp_path / "policy.yaml").write_text(MUTUAL)
    return tmp_path


def test_files_load_into_secrets_relative_to_the_policy(certs: Path) -> None:
    secrets = load_tls_secrets(load_policy_text(MUTUAL), certs)
    assert sorted(secrets) == ["listener/secure/ca", "listener/secure/cert", "service/model/ca"]
    cert = secrets["listener/secure/cert"]
    assert cert.certificate_chain == (certs / "certs/server.pem").read_bytes()
    assert cert.private_key == (certs / "certs/server-key.pem").read_bytes()
    assert "PRIVATE" not in repr(cert)


def test_readable_key_is_refused_with_the_chmod_to_run(certs: Path) -> None:
    key = certs / "certs" / "server-key.pem"
    os.chmod(key, 0o644)
    with pytest.raises(PolicyError) as error:
        load_tls_secrets(load_policy_text(MUTUAL), certs, source="policy.yaml")
    (issue,) = error.value.issues
    assert f"chmod 600 {key}" in issue.message and issue.path == "listeners[0].tls"
    assert "PRIVATE" not in str(error.value)


def test_missing_and_mismatched_files_are_refused(certs: Path) -> None:
    other = build_certificate(build_ca(), dns_names=["x"], server=True)
    (certs / "certs" / "server-key.pem").write_bytes(other.key_pem)
    (certs / "certs" / "ca.pem").unlink()
    with pytest.raises(PolicyError) as error:
        load_tls_secrets(load_policy_text(MUTUAL), certs)
    messages = " | ".join(i.message for i in error.value.issues)
    assert "does not match certificate" in messages
    assert "cannot read CA bundle" in messages and "ca.pem" in messages


def test_an_edit_whose_files_are_missing_is_refused(certs: Path) -> None:
    plane = ControlPlane(SnapshotCache())
    path = certs / "policy.yaml"
    source = CertificateSource(certs, source=str(path))
    watcher = PolicyWatcher(path, plane, sources=[source.resolve_state])
    applied = watcher.reload()
    assert applied is not None and applied.version is not None
    assert "listener/secure/cert" in plane.state.secrets
    (certs / "policy.yaml").write_text(MUTUAL.replace("certs/server.pem", "certs/nope.pem"))
    refused = watcher.reload()
    assert refused is not None and refused.refusal is not None
    assert "nope.pem" in "\n".join(refused.refusal.lines())
    assert plane.last_refused == refused.refusal
    # located on the TLS settings that name the file (line 6, column 5: "tls:")
    (issue,) = [i for i in refused.refusal.issues if "nope.pem" in i.message]
    assert (issue.file, issue.line, issue.column, issue.path) == (
        str(path),
        6,
        5,
        "listeners[0].tls",
    )
    assert plane.policy is not None and plane.policy.listeners[0].tls.certificate == (  # type: ignore[union-attr]
        "certs/server.pem"
    )


IDENTITY_ACCESS_RATE_LIMIT = """
version: 1
listeners:
  - name: secure
    port: 10443
    tls:
      mode: mutual
      certificate: s.pem
      private_key: k.pem
      client_ca: ca.pem
      allowed_identities: ["spiffe://td/ns/*/sa/*"]
services: [{name: m, endpoints: ["127.0.0.1:8001"]}]
routes:
  - name: admin
    match: {path: {prefix: /admin}}
    backends: [{service: m}]
    access: {allow: [{identities: ["spiffe://td/ns/ops/sa/*"]}]}
  - name: infer
    backends: [{service: m}]
    rate_limit: {requests_per_second: 100}
"""


def test_identity_access_and_rate_limit_each_keep_their_local_reply_body() -> None:
    policy = load_policy_text(IDENTITY_ACCESS_RATE_LIMIT)
    ir = resolve_policy(policy)
    manager = build_http_connection_manager(ir.listeners[0], observability=ir.observability)
    mappers = manager.local_reply_config.mappers
    bodies = [m.body_format_override.text_format_source.inline_string for m in mappers]
    assert len(bodies) == 3
    # Envoy uses the first match: the identity mapper, first, matches only its own 403s.
    assert "client certificate identity" in bodies[0] and "listener secure" in bodies[0]
    checks = mappers[0].filter.and_filter.filters
    assert checks[0].status_code_filter.comparison.value.default_value == 403
    assert checks[1].extension_filter.name == "envoy.access_loggers.extension_filters.cel"
    assert IDENTITY_DENIED_DETAILS.encode() in checks[1].extension_filter.typed_config.value
    assert bodies[1:] == [FORBIDDEN_BODY, RATE_LIMITED_BODY]
    assert mappers[1].filter.status_code_filter.comparison.value.default_value == 403
    assert mappers[2].filter.status_code_filter.comparison.value.default_value == 429
