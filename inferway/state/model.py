"""The ``State`` value and the records it holds (endpoints, TLS material, weight overrides).

Plain frozen data: a source builds a new State with ``dataclasses.replace`` instead of
mutating one, so the control plane can compare the State it applied with the next one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from inferway.policies.model import Endpoint

__all__ = ["ReplicaLoad", "ServiceEndpoints", "State", "TlsMaterial", "WeightOverrides"]

ServiceEndpoints = Mapping[str, tuple[Endpoint, ...]]
"""Service name -> its endpoints."""

WeightOverrides = Mapping[str, Mapping[str, float]]
"""Route name -> {service name: weight}, weights as in the policy (percent, 0.1 steps)."""


def _empty() -> Mapping[str, object]:
    return MappingProxyType({})


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


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One model server's load as its own metrics last showed it (a ``process: envoy``,
    ``pick: score`` picker's replicas, pushed to Envoy's Lua picker with the routes). None:
    not known (the server does not say)."""

    depth: float | None = None
    """Requests waiting plus running."""
    kv_cache: float | None = None
    """KV-cache use, 0..1."""
    loras_running: frozenset[str] = frozenset()
    loras_waiting: frozenset[str] = frozenset()
    max_lora: int | None = None


@dataclass(frozen=True)
class State:
    """Everything besides the policy file that shapes the config."""

    endpoints: ServiceEndpoints = field(default_factory=_empty)  # type: ignore[arg-type]
    """Service name -> endpoints from an endpoints file or discovery; replaces the policy's
    inline list for that service."""
    secrets: Mapping[str, TlsMaterial] = field(default_factory=_empty)  # type: ignore[arg-type]
    """Secret name -> TLS material from certificate files, delivered to Envoy over SDS."""
    weights: WeightOverrides = field(default_factory=_empty)  # type: ignore[arg-type]
    """Route name -> {service: weight} (the rollout controller): replaces the policy weight
    of each backend it names."""
    replicas: ServiceEndpoints = field(default_factory=_empty)  # type: ignore[arg-type]
    """Service name -> endpoints of replicas started at runtime (the autoscaler), added to
    the service's endpoints."""
    rate_shares: Mapping[str, Mapping[str, int]] = field(default_factory=_empty)  # type: ignore[arg-type]
    """Route name -> {Envoy node id: tokens per fill}: each Envoy's share of the route's
    fleet-wide rate limit (the fleet leader's split, from each Envoy's offered load)."""
    saturated: Mapping[str, frozenset[tuple[str, int]]] = field(default_factory=_empty)  # type: ignore[arg-type]
    """Service name -> the (host, port) of its replicas Envoy leaves out for now (sent as
    DEGRADED): a ``process: envoy`` picker's replicas the servers' own metrics show saturated
    (inferway/gateway/picker/in_envoy.py)."""
    picker_load: Mapping[str, Mapping[str, ReplicaLoad]] = field(default_factory=_empty)  # type: ignore[arg-type]
    """Service name -> ``ip:port`` -> that replica's load as last scraped, for a ``process:
    envoy``, ``pick: score`` picker (Envoy's Lua picker reads it from its route's metadata)."""
