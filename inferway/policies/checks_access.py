"""Semantic checks for route access rules.

An ``identities`` rule matches the client certificate's identity. On a listener that does not
require client certificates there is no verified identity, so such a rule could never allow
anyone (or, in a deny rule, never deny anyone): almost certainly a mistake, so it is refused.
"""

from __future__ import annotations

from collections.abc import Iterator

from inferway.policies.model import Listener, Policy
from inferway.policies.yaml_marks import Loc

__all__ = ["check_access", "listener_requires_client_certificate"]


def listener_requires_client_certificate(listener: Listener) -> bool:
    """True when the listener terminates TLS and requires (and verifies) a client certificate.

    Reads the listener's ``tls`` settings by duck typing so this check does not depend on how
    the TLS schema spells "mutual": any of ``require_client_certificate: true``,
    ``client_certificate: required`` or ``mode: mutual`` counts.
    """
    tls = getattr(listener, "tls", None)
    if tls is None:
        return False
    if getattr(tls, "require_client_certificate", False) is True:
        return True
    if str(getattr(tls, "client_certificate", "")).lower() in ("required", "require"):
        return True
    return str(getattr(tls, "mode", "")).lower() in ("mutual", "mtls")


def check_access(policy: Policy) -> Iterator[tuple[Loc, str]]:
    listeners = {x.name: x for x in policy.listeners}
    for r, route in enumerate(policy.routes):
        if route.access is None:
            continue
        served = route.listeners if route.listeners is not None else list(listeners)
        plain = [
            name
            for name in served
            if name in listeners and not listener_requires_client_certificate(listeners[name])
        ]
        if not plain:
            continue
        for kind in ("allow", "deny"):
            for i, rule in enumerate(getattr(route.access, kind)):
                if rule.identities:
                    yield (
                        ("routes", r, "access", kind, i, "identities"),
                        f"route '{route.name}' is served on listener '{plain[0]}', which does "
                        "not require client certificates, so there is no client identity to "
                        "match; require client certificates on that listener (mutual TLS) or "
                        "serve this route only on mutual-TLS listeners",
                    )
