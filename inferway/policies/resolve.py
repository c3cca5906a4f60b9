"""Merge the policy with the runtime sources into the IR the translator reads.

The policy is what the user wrote; runtime state is what arrives from elsewhere while it
runs: endpoints from a watched endpoints file (or discovery), TLS material from watched
certificate files. ``resolve_policy`` is the one place these sources meet, so the translator
stays a pure function of one value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from inferway.policies.model import Endpoint, Policy

__all__ = ["Resolved", "RuntimeState", "TlsMaterial", "resolve_policy"]


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes of one certificate set, as read from disk (keys are never logged)."""

    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    trusted_ca: bytes | None = None

    def __repr__(self) -> str:  # keep private keys out of logs and tracebacks
        parts = [
            f"certificate_chain={len(self.certificate_chain or b'')}B",
            f"private_key={'<set>' if self.private_key else None}",
            f"trusted_ca={len(self.trusted_ca or b'')}B",
        ]
        return f"TlsMaterial({', '.join(parts)})"


@dataclass(frozen=True)
class RuntimeState:
    """Everything besides the policy file that shapes the config."""

    endpoints: Mapping[str, tuple[Endpoint, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    """Service name -> endpoints from an endpoints source; replaces the policy's inline list."""
    secrets: Mapping[str, TlsMaterial] = field(default_factory=lambda: MappingProxyType({}))
    """Secret name -> TLS material, delivered to Envoy over SDS."""


@dataclass(frozen=True)
class Resolved:
    """The IR: a fully resolved policy plus the secrets it refers to. Plain data."""

    policy: Policy
    secrets: Mapping[str, TlsMaterial] = field(default_factory=lambda: MappingProxyType({}))


def resolve_policy(policy: Policy, state: RuntimeState | None = None) -> Resolved:
    """Services named in ``state.endpoints`` take those endpoints instead of the inline ones."""
    state = state or RuntimeState()
    if state.endpoints:
        services = [
            service.model_copy(update={"endpoints": list(state.endpoints[service.name])})
            if service.name in state.endpoints
            else service
            for service in policy.services
        ]
        policy = policy.model_copy(update={"services": services})
    return Resolved(policy=policy, secrets=MappingProxyType(dict(state.secrets)))
