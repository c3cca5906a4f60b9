"""Semantic checks for TLS settings: the files each mode needs, and settings a mode ignores.

A setting that would be silently ignored (a client CA on a one-way TLS listener, allowed
identities without client certificates) is refused, because its author clearly expected it
to do something. Whether the files exist and are safe is checked when they are loaded
(``inferway.gateway.cert_watcher``), since this module does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator

from inferway.policies.model import Policy
from inferway.policies.yaml_marks import Loc

__all__ = ["check_tls"]


def _missing(obj: object, fields: tuple[str, ...]) -> list[str]:
    return [name for name in fields if getattr(obj, name) is None]


def _unused(obj: object, fields: tuple[str, ...]) -> list[str]:
    return [name for name in fields if getattr(obj, name)]


def check_tls(policy: Policy) -> Iterator[tuple[Loc, str]]:
    for i, listener in enumerate(policy.listeners):
        tls = getattr(listener, "tls", None)
        if tls is None:
            continue
        loc: Loc = ("listeners", i, "tls")
        needs = {
            "none": (),
            "tls": ("certificate", "private_key"),
            "mutual": ("certificate", "private_key", "client_ca"),
        }[tls.mode]
        for name in _missing(tls, needs):
            yield (*loc, "mode"), f"mode '{tls.mode}' needs '{name}' (a PEM file path)"
        ignored = {
            "none": ("certificate", "private_key", "client_ca", "allowed_identities"),
            "tls": ("client_ca", "allowed_identities"),
            "mutual": (),
        }[tls.mode]
        for name in _unused(tls, ignored):
            yield (
                (*loc, name),
                f"'{name}' has no effect in mode '{tls.mode}'"
                + (
                    " (client certificates are only requested in mode 'mutual')"
                    if tls.mode == "tls"
                    else "; remove it or set mode: tls/mutual"
                ),
            )
    for s, service in enumerate(policy.services):
        tls = getattr(service, "tls", None)
        if tls is None:
            continue
        loc = ("services", s, "tls")
        needs = {
            "none": (),
            "tls": ("ca",),
            "mutual": ("ca", "certificate", "private_key"),
        }[tls.mode]
        for name in _missing(tls, needs):
            yield (*loc, "mode"), f"mode '{tls.mode}' needs '{name}' (a PEM file path)"
        ignored = {
            "none": ("ca", "certificate", "private_key", "sni"),
            "tls": ("certificate", "private_key"),
            "mutual": (),
        }[tls.mode]
        for name in _unused(tls, ignored):
            yield (
                (*loc, name),
                f"'{name}' has no effect in mode '{tls.mode}'"
                + (
                    "; Envoy presents a client certificate only in mode 'mutual'"
                    if tls.mode == "tls"
                    else "; remove it or set mode: tls/mutual"
                ),
            )
