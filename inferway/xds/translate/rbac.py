"""Route access rules -> Envoy's RBAC HTTP filter, configured per route.

The HCM of a listener with restricted routes gets one ``envoy.filters.http.rbac`` filter with
no rules of its own (it lets everything through), placed first in the chain so a refused
request never reaches rate limiting or the router. Each restricted route overrides it with an
``RBACPerRoute`` whose single DENY-action RBAC has up to two policies:

* ``denied-by-rule``: any deny rule matches (deny wins);
* ``not-allowed``: no allow rule matches (present only when allow rules exist).

Envoy records the matched policy in the response code details
(``rbac_access_denied_matched_policy[not-allowed]``), so an access log says why. Refusals are
403s; a local-reply mapper gives them a JSON body naming the route. Source IPs match the
connection's peer (``direct_remote_ip``), never ``X-Forwarded-For``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from google.protobuf.wrappers_pb2 import UInt32Value

from inferway._xds_protos.envoy.config.accesslog.v3 import accesslog_pb2
from inferway._xds_protos.envoy.config.core.v3 import (
    address_pb2,
    base_pb2,
    substitution_format_string_pb2,
)
from inferway._xds_protos.envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.type.matcher.v3 import string_pb2
from inferway.resolve.ir.access import AccessHeaderIR, AccessIR, AccessRuleIR
from inferway.resolve.ir.route import RouteIR
from inferway.xds.translate._protos import pack
from inferway.xds.translate.tls import build_identity_matcher

__all__ = [
    "DENIED_BY_RULE_POLICY",
    "FORBIDDEN_BODY",
    "NOT_ALLOWED_POLICY",
    "RBAC_FILTER",
    "add_route_access",
    "apply_access_control",
    "build_access_denied_mapper",
    "build_rbac_filter",
    "build_rbac_per_route",
    "build_rule_principal",
    "restricted_routes",
]

RBAC_FILTER = "envoy.filters.http.rbac"
DENIED_BY_RULE_POLICY = "denied-by-rule"
NOT_ALLOWED_POLICY = "not-allowed"
FORBIDDEN_BODY = '{"error":"forbidden: route %ROUTE_NAME% denies this client"}\n'
"""The 403 body; ``%ROUTE_NAME%`` is Envoy's command operator for the matched route's name."""

_FORBIDDEN = 403
_STATUS_RUNTIME_KEY = "inferway.access_denied.status"


def restricted_routes(routes: Sequence[RouteIR]) -> list[RouteIR]:
    """Routes with access rules (the IR has no access for an unrestricted route)."""
    return [r for r in routes if r.access is not None]


def build_rbac_filter() -> hcm_pb2.HttpFilter:
    """The HCM-level filter: no rules, so routes without ``access`` pass untouched."""
    return hcm_pb2.HttpFilter(name=RBAC_FILTER, typed_config=pack(rbac_pb2.RBAC()))


def build_rbac_per_route(access: AccessIR) -> rbac_pb2.RBACPerRoute:
    policies: dict[str, rbac_config_pb2.Policy] = {}
    if access.deny:
        policies[DENIED_BY_RULE_POLICY] = _policy([build_rule_principal(r) for r in access.deny])
    if access.allow:
        allowed = _any_of([build_rule_principal(r) for r in access.allow])
        policies[NOT_ALLOWED_POLICY] = _policy([rbac_config_pb2.Principal(not_id=allowed)])
    rules = rbac_config_pb2.RBAC(action=rbac_config_pb2.RBAC.Action.DENY, policies=policies)
    return rbac_pb2.RBACPerRoute(rbac=rbac_pb2.RBAC(rules=rules))


def build_rule_principal(rule: AccessRuleIR) -> rbac_config_pb2.Principal:
    """Every field given must match (and_ids); within a field any entry may (or_ids)."""
    parts: list[rbac_config_pb2.Principal] = []
    if rule.identities:
        parts.append(_any_of([_identity(i) for i in rule.identities]))
    if rule.source_ips:
        parts.append(_any_of([_source_ip(c) for c in rule.source_ips]))
    if rule.headers:
        parts.append(_all_of([_header(h) for h in rule.headers]))
    return _all_of(parts)


def build_access_denied_mapper() -> hcm_pb2.ResponseMapper:
    """Local replies with status 403 get a JSON body naming the route. Among inferway's
    filters only RBAC answers 403 locally; upstream 403s are not local replies."""
    status = accesslog_pb2.StatusCodeFilter(
        comparison=accesslog_pb2.ComparisonFilter(
            op=accesslog_pb2.ComparisonFilter.Op.EQ,
            value=base_pb2.RuntimeUInt32(default_value=_FORBIDDEN, runtime_key=_STATUS_RUNTIME_KEY),
        )
    )
    return hcm_pb2.ResponseMapper(
        filter=accesslog_pb2.AccessLogFilter(status_code_filter=status),
        status_code=UInt32Value(value=_FORBIDDEN),
        body_format_override=substitution_format_string_pb2.SubstitutionFormatString(
            text_format_source=base_pb2.DataSource(inline_string=FORBIDDEN_BODY),
            content_type="application/json",
        ),
    )


def apply_access_control(manager: hcm_pb2.HttpConnectionManager, routes: Sequence[RouteIR]) -> None:
    """Put the RBAC filter first in ``manager`` and the 403 body mapper in its local replies,
    when any of ``routes`` (those served on its listener) restricts access."""
    if not restricted_routes(routes):
        return
    manager.http_filters.insert(0, build_rbac_filter())
    manager.local_reply_config.mappers.append(build_access_denied_mapper())


def add_route_access(route_proto: rc_pb2.Route, route: RouteIR) -> None:
    """Attach the route's RBACPerRoute (nothing when the route is unrestricted)."""
    if route.access is not None:
        route_proto.typed_per_filter_config[RBAC_FILTER].CopyFrom(
            pack(build_rbac_per_route(route.access))
        )


def _policy(principals: list[rbac_config_pb2.Principal]) -> rbac_config_pb2.Policy:
    return rbac_config_pb2.Policy(
        permissions=[rbac_config_pb2.Permission(any=True)], principals=principals
    )


def _any_of(ids: list[rbac_config_pb2.Principal]) -> rbac_config_pb2.Principal:
    if len(ids) == 1:
        return ids[0]
    return rbac_config_pb2.Principal(or_ids=rbac_config_pb2.Principal.Set(ids=ids))


def _all_of(ids: list[rbac_config_pb2.Principal]) -> rbac_config_pb2.Principal:
    if len(ids) == 1:
        return ids[0]
    return rbac_config_pb2.Principal(and_ids=rbac_config_pb2.Principal.Set(ids=ids))


def _identity(pattern: str) -> rbac_config_pb2.Principal:
    """Envoy compares against the peer certificate's URI SAN, then DNS SAN, then subject;
    ``*`` works as in the listener's ``allowed_identities`` (one matcher for both)."""
    return rbac_config_pb2.Principal(
        authenticated=rbac_config_pb2.Principal.Authenticated(
            principal_name=build_identity_matcher(pattern)
        )
    )


def _source_ip(cidr: str) -> rbac_config_pb2.Principal:
    network = ipaddress.ip_network(cidr)
    return rbac_config_pb2.Principal(
        direct_remote_ip=address_pb2.CidrRange(
            address_prefix=str(network.network_address),
            prefix_len=UInt32Value(value=network.prefixlen),
        )
    )


def _header(header: AccessHeaderIR) -> rbac_config_pb2.Principal:
    matcher = rc_pb2.HeaderMatcher(name=header.name)
    if header.present:
        matcher.present_match = True
    elif header.exact is not None:
        matcher.string_match.CopyFrom(string_pb2.StringMatcher(exact=header.exact))
    else:
        assert header.prefix is not None  # AccessHeaderIR holds exactly one
        matcher.string_match.CopyFrom(string_pb2.StringMatcher(prefix=header.prefix))
    return rbac_config_pb2.Principal(header=matcher)
