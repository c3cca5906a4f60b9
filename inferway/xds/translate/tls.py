"""TLS: listener (downstream) and service (upstream) TLS contexts, SDS secrets, and the
listener-level client-identity check.

Certificates never appear in listener or cluster config: both refer to named secrets fetched
by SDS over the ADS stream, so a rotated certificate is one Secret update: new handshakes use
it, established connections stay, and the listener is not drained.

A mutual listener verifies the chain (trusted CA, expiry) at the handshake; the identity
check (``allowed_identities``) is an RBAC filter on the authenticated principal, so a valid
certificate with the wrong identity gets a 403 with a body saying why instead of an opaque
handshake failure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from google.protobuf.wrappers_pb2 import BoolValue, UInt32Value

from inferway._xds_protos.envoy.config.accesslog.v3 import accesslog_pb2
from inferway._xds_protos.envoy.config.core.v3 import base_pb2, substitution_format_string_pb2
from inferway._xds_protos.envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from inferway._xds_protos.envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from inferway._xds_protos.envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.extensions.transport_sockets.tls.v3 import (
    common_pb2,
    secret_pb2,
    tls_pb2,
)
from inferway._xds_protos.envoy.type.matcher.v3 import regex_pb2, string_pb2
from inferway.resolve.ir import SecretIR
from inferway.resolve.ir.listener import ListenerIR
from inferway.resolve.ir.service import ServiceIR
from inferway.state.model import TlsMaterial
from inferway.xds.translate._protos import ads_config_source, pack

__all__ = [
    "IDENTITY_DENIED_DETAILS",
    "IDENTITY_FILTER",
    "TLS_TRANSPORT_SOCKET",
    "apply_identity_check",
    "build_downstream_tls_context",
    "build_identity_denied_mapper",
    "build_identity_filter",
    "build_identity_matcher",
    "build_listener_transport_socket",
    "build_secret",
    "build_secrets",
    "build_service_transport_socket",
    "build_upstream_tls_context",
]

TLS_TRANSPORT_SOCKET = "envoy.transport_sockets.tls"
IDENTITY_FILTER = "inferway.listener_identity"
"""Named apart from the per-route RBAC filter so route overrides never replace this check."""
IDENTITY_POLICY = "identity-not-allowed"
IDENTITY_DENIED_DETAILS = f"rbac_access_denied_matched_policy[{IDENTITY_POLICY}]"
"""Envoy's response code details for a 403 from the identity check: the RBAC filter names
the DENY policy that matched, which no route access policy shares."""
CEL_FILTER = "envoy.access_loggers.extension_filters.cel"
IDENTITY_DENIED_BODY = (
    '{"error":"forbidden: client certificate identity %DOWNSTREAM_PEER_URI_SAN% '
    'is not allowed on listener %s"}\n'
)

_VERSIONS = {
    "1.2": common_pb2.TlsParameters.TlsProtocol.TLSv1_2,
    "1.3": common_pb2.TlsParameters.TlsProtocol.TLSv1_3,
}
_FORBIDDEN = 403


def _sds(name: str) -> secret_pb2.SdsSecretConfig:
    return secret_pb2.SdsSecretConfig(name=name, sds_config=ads_config_source())


def build_downstream_tls_context(listener: ListenerIR) -> tls_pb2.DownstreamTlsContext | None:
    """None for a plain listener. TLS 1.3 is the maximum; ``min_version`` the minimum."""
    tls = listener.tls
    if tls is None:
        return None
    common = tls_pb2.CommonTlsContext(
        tls_params=common_pb2.TlsParameters(
            tls_minimum_protocol_version=_VERSIONS[tls.min_version],
            tls_maximum_protocol_version=common_pb2.TlsParameters.TlsProtocol.TLSv1_3,
        ),
        tls_certificate_sds_secret_configs=[_sds(tls.certificate_secret)],
        alpn_protocols=["h2", "http/1.1"],
    )
    if tls.client_ca_secret is not None:
        common.validation_context_sds_secret_config.CopyFrom(_sds(tls.client_ca_secret))
    context = tls_pb2.DownstreamTlsContext(common_tls_context=common)  # copies ``common``
    if tls.client_ca_secret is not None:
        context.require_client_certificate.CopyFrom(BoolValue(value=True))
    return context


def build_upstream_tls_context(service: ServiceIR) -> tls_pb2.UpstreamTlsContext | None:
    """None for a plain service. With ``sni`` the replica's certificate must carry it as a
    DNS SAN; without, any certificate chaining to the CA is accepted."""
    tls = service.tls
    if tls is None:
        return None
    common = tls_pb2.CommonTlsContext()
    if service.protocol == "http2":
        common.alpn_protocols.append("h2")
    if tls.certificate_secret is not None:
        common.tls_certificate_sds_secret_configs.append(_sds(tls.certificate_secret))
    default = common_pb2.CertificateValidationContext()
    if tls.sni:
        default.match_typed_subject_alt_names.append(
            common_pb2.SubjectAltNameMatcher(
                san_type=common_pb2.SubjectAltNameMatcher.SanType.DNS,
                matcher=string_pb2.StringMatcher(exact=tls.sni),
            )
        )
    common.combined_validation_context.CopyFrom(
        tls_pb2.CommonTlsContext.CombinedCertificateValidationContext(
            default_validation_context=default,
            validation_context_sds_secret_config=_sds(tls.ca_secret),
        )
    )
    context = tls_pb2.UpstreamTlsContext(common_tls_context=common)
    if tls.sni:
        context.sni = tls.sni
    return context


def build_listener_transport_socket(listener: ListenerIR) -> base_pb2.TransportSocket | None:
    context = build_downstream_tls_context(listener)
    if context is None:
        return None
    return base_pb2.TransportSocket(name=TLS_TRANSPORT_SOCKET, typed_config=pack(context))


def build_service_transport_socket(service: ServiceIR) -> base_pb2.TransportSocket | None:
    context = build_upstream_tls_context(service)
    if context is None:
        return None
    return base_pb2.TransportSocket(name=TLS_TRANSPORT_SOCKET, typed_config=pack(context))


def build_identity_matcher(pattern: str) -> string_pb2.StringMatcher:
    """``*`` matches any run of characters: none -> exact, one trailing -> prefix, else an
    anchored RE2 regex with every other character literal."""
    if "*" not in pattern:
        return string_pb2.StringMatcher(exact=pattern)
    if pattern.count("*") == 1 and pattern.endswith("*"):
        return string_pb2.StringMatcher(prefix=pattern[:-1])
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return string_pb2.StringMatcher(
        safe_regex=regex_pb2.RegexMatcher(
            google_re2=regex_pb2.RegexMatcher.GoogleRE2(), regex=regex
        )
    )


def build_identity_filter(listener: ListenerIR) -> hcm_pb2.HttpFilter | None:
    """RBAC on the peer certificate's principal (URI SAN, else DNS SAN): DENY when it is none
    of the allowed identities, so the refusal names :data:`IDENTITY_POLICY` in its details."""
    tls = listener.tls
    if tls is None or not tls.allowed_identities:
        return None
    allowed = rbac_config_pb2.Principal(
        or_ids=rbac_config_pb2.Principal.Set(
            ids=[
                rbac_config_pb2.Principal(
                    authenticated=rbac_config_pb2.Principal.Authenticated(
                        principal_name=build_identity_matcher(pattern)
                    )
                )
                for pattern in tls.allowed_identities
            ]
        )
    )
    rules = rbac_config_pb2.RBAC(
        action=rbac_config_pb2.RBAC.Action.DENY,
        policies={
            IDENTITY_POLICY: rbac_config_pb2.Policy(
                permissions=[rbac_config_pb2.Permission(any=True)],
                principals=[rbac_config_pb2.Principal(not_id=allowed)],
            )
        },
    )
    config = rbac_pb2.RBAC(rules=rules, rules_stat_prefix="listener_identity.")
    return hcm_pb2.HttpFilter(name=IDENTITY_FILTER, typed_config=pack(config))


def build_identity_denied_mapper(listener: ListenerIR) -> hcm_pb2.ResponseMapper:
    """The identity check's 403s (and only those: matched by their response code details,
    since route access rules answer 403 too) get a JSON body naming the refused identity."""
    status = accesslog_pb2.StatusCodeFilter(
        comparison=accesslog_pb2.ComparisonFilter(
            op=accesslog_pb2.ComparisonFilter.Op.EQ,
            value=base_pb2.RuntimeUInt32(
                default_value=_FORBIDDEN, runtime_key="inferway.identity_denied.status"
            ),
        )
    )
    details = accesslog_pb2.ExtensionFilter(
        name=CEL_FILTER,
        typed_config=pack(
            cel_pb2.ExpressionFilter(
                expression=f"response.code_details == '{IDENTITY_DENIED_DETAILS}'"
            )
        ),
    )
    both = accesslog_pb2.AndFilter(
        filters=[
            accesslog_pb2.AccessLogFilter(status_code_filter=status),
            accesslog_pb2.AccessLogFilter(extension_filter=details),
        ]
    )
    return hcm_pb2.ResponseMapper(
        filter=accesslog_pb2.AccessLogFilter(and_filter=both),
        status_code=UInt32Value(value=_FORBIDDEN),
        body_format_override=substitution_format_string_pb2.SubstitutionFormatString(
            text_format_source=base_pb2.DataSource(
                inline_string=IDENTITY_DENIED_BODY.replace("%s", listener.name)
            ),
            content_type="application/json",
        ),
    )


def apply_identity_check(manager: hcm_pb2.HttpConnectionManager, listener: ListenerIR) -> None:
    """First filter of the chain (before route RBAC, rate limits, the router), and first
    local-reply mapper: Envoy uses the first mapper that matches, and this one matches only
    the identity check's own 403s, so route access 403s and rate-limit 429s keep theirs."""
    identity = build_identity_filter(listener)
    if identity is None:
        return
    manager.http_filters.insert(0, identity)
    manager.local_reply_config.mappers.insert(0, build_identity_denied_mapper(listener))


def build_secret(name: str, material: TlsMaterial) -> secret_pb2.Secret:
    """A certificate+key secret when the material has both, else a validation context."""
    secret = secret_pb2.Secret(name=name)
    if material.certificate_chain and material.private_key:
        secret.tls_certificate.CopyFrom(
            common_pb2.TlsCertificate(
                certificate_chain=base_pb2.DataSource(inline_bytes=material.certificate_chain),
                private_key=base_pb2.DataSource(inline_bytes=material.private_key),
            )
        )
    elif material.trusted_ca:
        secret.validation_context.CopyFrom(
            common_pb2.CertificateValidationContext(
                trusted_ca=base_pb2.DataSource(inline_bytes=material.trusted_ca)
            )
        )
    else:
        raise ValueError(f"secret {name!r} has neither a certificate with its key nor a CA")
    return secret


def build_secrets(secrets: Sequence[SecretIR]) -> list[tuple[str, secret_pb2.Secret]]:
    return [(s.name, build_secret(s.name, s.material)) for s in secrets]
