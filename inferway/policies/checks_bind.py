"""The one policy check that touches the machine: can this host bind every listener?

Run by ``inferway run`` before it starts Envoy (never by ``validate``, which may run elsewhere,
nor on edits, when the supervised Envoy itself holds the ports): a port another process holds
would otherwise only show up as Envoy rejecting the listeners.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

from inferway.policies.errors import PolicyIssue
from inferway.policies.located import locate_issue, parse_located
from inferway.policies.model import Policy
from inferway.policies.yaml_marks import Loc

__all__ = ["check_listeners_bindable", "listener_bind_issues"]


def check_listeners_bindable(policy: Policy) -> Iterator[tuple[Loc, str]]:
    """(loc, message) for each listener whose address and port cannot be bound now."""
    for index, listener in enumerate(policy.listeners):
        address = listener.address
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        shown = f"[{address}]:{listener.port}" if ":" in address else f"{address}:{listener.port}"
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Envoy binds
            try:
                sock.bind((address, listener.port))
            except OSError as error:
                reason = error.strerror or str(error)
                yield (
                    ("listeners", index, "port"),
                    f"listener '{listener.name}' cannot bind {shown} on this machine: {reason} "
                    "(is another process listening there?)",
                )


def listener_bind_issues(policy: Policy, text: str, source: str) -> list[PolicyIssue]:
    """``check_listeners_bindable`` as located issues of the policy ``text`` from ``source``."""
    found = list(check_listeners_bindable(policy))
    if not found:
        return []
    document, _ = parse_located(text, source)
    return [locate_issue(document, source, loc, message) for loc, message in found]
