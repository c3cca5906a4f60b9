"""Semantic checks for TLS settings: the files each mode needs, and settings a mode ignores.

A setting that would be silently ignored (a client CA on a one-way TLS listener, allowed
identities without client certificates) is refused, because its author clearly expected it
to do something. Whether the files exist and are safe is checked when they are loaded
(``inferway.gateway.cert_watcher``), since this module does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from inferway.policies.model import Policy
from inferway.policies.yaml_marks import Loc

__all__ = ["check_tls"]


def _missing(obj: object, fields: tuple[str, ...]) -> list[str]:
    return [name for name in fields if getattr(obj, name) is None]


def _unused(obj: object, fields: tuple[str, ...]) -> list[str]:
    return [name for name in fields if getattr(obj, name)]


_LISTENER_NEEDS = {
    "none": (),
    "tls": ("certificate", "private_key"),
    "mutual": ("certificate", "private_key", "client_ca"),
}
_LISTENER_IGNORED = {
    "none": ("certificate", "private_key", "client_ca", "allowed_identities"),
    "tls": ("client_ca", "allowed_identities"),
    "mutual": (),
}
_SERVICE_NEEDS = {"none": (), "tls": ("ca",), "mutual": ("ca", "certificate", "private_key")}
_SERVICE_IGNORED = {
    "none": ("ca", "certificate", "private_key", "sni"),
    "tls": ("certificate", "private_key"),
    "mutual": (),
}


def check_tls(policy: Policy) -> Iterator[tuple[Loc, str]]:
    for i, listener in enumerate(policy.listeners):
        tls = getattr(listener, "tls", None)
        if tls is not None:
            yield from _check_mode_fields(
                tls,
                ("listeners", i, "tls"),
                _LISTENER_NEEDS[tls.mode],
                _LISTENER_IGNORED[tls.mode],
                " (client certificates are only requested in mode 'mutual')",
            )
    for s, service in enumerate(policy.services):
        tls = getattr(service, "tls", None)
        if tls is not None:
            yield from _check_mode_fields(
                tls,
                ("services", s, "tls"),
                _SERVICE_NEEDS[tls.mode],
                _SERVICE_IGNORED[tls.mode],
                "; Envoy presents a client certificate only in mode 'mutual'",
            )


def _check_mode_fields(
    tls: Any, loc: Loc, needs: tuple[str, ...], ignored: tuple[str, ...], tls_hint: str
) -> Iterator[tuple[Loc, str]]:
    """Files the mode needs but lacks, and fields the mode ignores but were given."""
    for name in _missing(tls, needs):
        yield (*loc, "mode"), f"mode '{tls.mode}' needs '{name}' (a PEM file path)"
    for name in _unused(tls, ignored):
        hint = tls_hint if tls.mode == "tls" else "; remove it or set mode: tls/mutual"
        yield (*loc, name), f"'{name}' has no effect in mode '{tls.mode}'{hint}"
