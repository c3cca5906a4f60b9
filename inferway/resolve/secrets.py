"""TLS in the IR: the SDS secret names listeners and services refer to, and the material
from State for exactly those names (material for names no longer used is left out)."""

from __future__ import annotations

from inferway.policies.model import Listener, Policy, Service
from inferway.resolve.ir import SecretIR
from inferway.resolve.ir.listener import DownstreamTlsIR
from inferway.resolve.ir.service import UpstreamTlsIR
from inferway.state.model import State

__all__ = [
    "listener_secret_names",
    "referenced_secret_names",
    "resolve_downstream_tls",
    "resolve_secrets",
    "resolve_upstream_tls",
    "service_secret_names",
]


def listener_secret_names(listener: Listener) -> dict[str, str]:
    """Role ("cert", "ca") -> SDS secret name for a TLS listener; empty when plain."""
    tls = listener.tls
    if tls is None or tls.mode == "none":
        return {}
    names = {"cert": f"listener/{listener.name}/cert"}
    if tls.mode == "mutual":
        names["ca"] = f"listener/{listener.name}/ca"
    return names


def service_secret_names(service: Service) -> dict[str, str]:
    """Role ("cert", "ca") -> SDS secret name for a service reached over TLS."""
    tls = service.tls
    if tls is None or tls.mode == "none":
        return {}
    names = {"ca": f"service/{service.name}/ca"}
    if tls.mode == "mutual":
        names["cert"] = f"service/{service.name}/cert"
    return names


def referenced_secret_names(policy: Policy) -> set[str]:
    """Every SDS secret name the policy's listeners and services refer to."""
    names: set[str] = set()
    for listener in policy.listeners:
        names.update(listener_secret_names(listener).values())
    for service in policy.services:
        names.update(service_secret_names(service).values())
    return names


def resolve_downstream_tls(listener: Listener) -> DownstreamTlsIR | None:
    names = listener_secret_names(listener)
    if not names or listener.tls is None:
        return None
    mutual = listener.tls.mode == "mutual"
    return DownstreamTlsIR(
        min_version=listener.tls.min_version,
        certificate_secret=names["cert"],
        client_ca_secret=names.get("ca"),
        allowed_identities=tuple(listener.tls.allowed_identities) if mutual else (),
    )


def resolve_upstream_tls(service: Service) -> UpstreamTlsIR | None:
    names = service_secret_names(service)
    if not names or service.tls is None:
        return None
    return UpstreamTlsIR(
        ca_secret=names["ca"], certificate_secret=names.get("cert"), sni=service.tls.sni or None
    )


def resolve_secrets(policy: Policy, state: State) -> tuple[SecretIR, ...]:
    wanted = referenced_secret_names(policy)
    return tuple(
        SecretIR(name=name, material=state.secrets[name])
        for name in sorted(state.secrets)
        if name in wanted
    )
