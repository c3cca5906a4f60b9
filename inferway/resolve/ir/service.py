"""IR of a service (one Envoy cluster): its endpoints after every source is merged, grouped
into localities with their weights, and its traffic settings with defaults applied."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from inferway.resolve.ir.picker import PickerIR
from inferway.resolve.ir.traffic import (
    CircuitBreakersIR,
    HealthCheckIR,
    LoadBalancingIR,
    OutlierDetectionIR,
    TcpKeepaliveIR,
)

__all__ = ["EndpointIR", "LocalityIR", "ServiceIR", "UpstreamTlsIR"]


@dataclass(frozen=True)
class EndpointIR:
    host: str
    port: int
    weight: int
    degraded: bool = False
    """Sent to Envoy as DEGRADED: left out of a hash table's replicas while others are
    healthy (a ``process: envoy`` picker's replica its own metrics show saturated)."""


@dataclass(frozen=True)
class LocalityIR:
    """The endpoints of one (priority, zone); ``zone`` is empty for endpoints without one."""

    priority: int
    zone: str
    weight: int
    endpoints: tuple[EndpointIR, ...]
    region: str = ""
    """The zone's region (the first its endpoints name); empty: none named."""


@dataclass(frozen=True)
class UpstreamTlsIR:
    """TLS from Envoy to the replicas; ``certificate_secret`` set means mutual TLS."""

    ca_secret: str
    certificate_secret: str | None
    sni: str | None


@dataclass(frozen=True)
class ServiceIR:
    name: str
    protocol: Literal["http1", "http2"]
    connect_timeout: float
    localities: tuple[LocalityIR, ...]
    """Sorted by (priority, zone), endpoints by (host, port)."""
    load_balancing: LoadBalancingIR
    health_check: HealthCheckIR | None
    outlier_detection: OutlierDetectionIR | None
    circuit_breakers: CircuitBreakersIR
    tls: UpstreamTlsIR | None
    tcp_keepalive: TcpKeepaliveIR | None = None
    """None: off (the kernel's defaults, hours)."""
    picker: Annotated[PickerIR | None, Field(exclude_if=lambda value: value is None)] = None
    """An endpoint picker chooses the replica per request (override_host); left out of the
    IR's YAML when there is none."""

    @property
    def endpoints(self) -> tuple[EndpointIR, ...]:
        return tuple(e for locality in self.localities for e in locality.endpoints)
