"""A copy of a policy safe to show: secret header values replaced by ``<redacted>``.

Why: the admin API's ``GET /policy`` shows the live policy, and an access rule such as
``headers: [{name: x-api-key, exact: s3cret}]`` is an API key in plain text. Whoever may read
the admin API must not learn the keys that route access is granted with. Redacted are:

* every header value (``exact``/``prefix``) of every access rule, whatever the header's name;
* a route match's header value (``exact``/``prefix``/``regex``) when the header carries
  credentials (``authorization``, ``x-api-key``...) or is named in ``redact_headers``.

Only the shown copy changes; the policy that is live (and its version) is untouched.
"""

from __future__ import annotations

from inferway.observability.redaction import CREDENTIAL_HEADERS
from inferway.policies.access import Access, AccessHeader, AccessRule
from inferway.policies.model import HeaderMatch, Policy, Route

__all__ = ["REDACTED_VALUE", "build_redacted_policy"]

REDACTED_VALUE = "<redacted>"


def build_redacted_policy(policy: Policy) -> Policy:
    """``policy`` with secret header values replaced by :data:`REDACTED_VALUE`."""
    secret_names = {*CREDENTIAL_HEADERS, *policy.redact_headers}
    routes = [_route(route, secret_names) for route in policy.routes]
    return policy.model_copy(update={"routes": routes})


def _route(route: Route, secret_names: set[str]) -> Route:
    update: dict[str, object] = {}
    if route.match.headers:
        headers = [_header_match(h, secret_names) for h in route.match.headers]
        update["match"] = route.match.model_copy(update={"headers": headers})
    if route.access is not None:
        update["access"] = _access(route.access)
    return route.model_copy(update=update) if update else route


def _header_match(header: HeaderMatch, secret_names: set[str]) -> HeaderMatch:
    if header.name.lower() not in secret_names:
        return header
    return header.model_copy(update=_masked(header, ("exact", "prefix", "regex")))


def _access(access: Access) -> Access:
    return access.model_copy(
        update={"allow": [_rule(r) for r in access.allow], "deny": [_rule(r) for r in access.deny]}
    )


def _rule(rule: AccessRule) -> AccessRule:
    if not rule.headers:
        return rule
    headers = [h.model_copy(update=_masked(h, ("exact", "prefix"))) for h in rule.headers]
    return rule.model_copy(update={"headers": headers})


def _masked(header: HeaderMatch | AccessHeader, fields: tuple[str, ...]) -> dict[str, str]:
    return {name: REDACTED_VALUE for name in fields if getattr(header, name) is not None}
