"""The IR: what ``resolve`` produces and the translator reads. Plain frozen dataclasses,
every default applied and every runtime source merged, serializable to YAML
(:mod:`inferway.resolve.ir.serialize`) so each layer is golden-tested on its own."""

from __future__ import annotations

from dataclasses import dataclass

from inferway.resolve.ir.features import FeatureRouterIR
from inferway.resolve.ir.grpc_target import GrpcTargetIR
from inferway.resolve.ir.listener import ListenerIR
from inferway.resolve.ir.llm import LlmGatewayIR
from inferway.resolve.ir.observability import ObservabilityIR
from inferway.resolve.ir.service import ServiceIR
from inferway.state.model import TlsMaterial

__all__ = ["IR", "SecretIR"]


@dataclass(frozen=True)
class SecretIR:
    """TLS material for one SDS secret the listeners or services refer to."""

    name: str
    material: TlsMaterial


@dataclass(frozen=True)
class IR:
    listeners: tuple[ListenerIR, ...]
    services: tuple[ServiceIR, ...]
    observability: ObservabilityIR
    secrets: tuple[SecretIR, ...]
    """Sorted by name; only secrets something refers to."""
    redacted_headers: tuple[str, ...]
    """Never logged or traced: the credential headers plus the policy's redact_headers."""
    grpc_targets: tuple[GrpcTargetIR, ...] = ()
    """What proxyless gRPC clients may dial, in policy order (Envoy nodes never see these)."""
    feature_router: FeatureRouterIR | None = None
    """Set when a route matches on body features: the external processor Envoy asks."""
    llm: LlmGatewayIR | None = None
    """Set when a route is an ``openai`` one: the LLM processor Envoy asks."""
