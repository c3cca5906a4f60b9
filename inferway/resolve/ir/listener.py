"""IR of a listener: where Envoy accepts client traffic, its TLS, and the routes it serves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inferway.resolve.ir.route import RouteIR

__all__ = ["DownstreamTlsIR", "ListenerIR", "ListenerLimitsIR"]


@dataclass(frozen=True)
class ListenerLimitsIR:
    """The listener's slow-client timeouts in seconds (0: off) and the largest declared
    request body Envoy forwards (policies/listener_limits.py)."""

    request_headers_timeout_s: float = 10.0
    stream_idle_timeout_s: float = 300.0
    request_timeout_s: float = 300.0
    max_request_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class DownstreamTlsIR:
    """TLS a listener terminates. ``client_ca_secret`` set means mutual TLS."""

    min_version: Literal["1.2", "1.3"]
    certificate_secret: str
    client_ca_secret: str | None
    allowed_identities: tuple[str, ...]
    """Mutual listeners only; empty: any certificate from the client CA."""


@dataclass(frozen=True)
class ListenerIR:
    name: str
    address: str
    port: int
    tls: DownstreamTlsIR | None
    routes: tuple[RouteIR, ...]
    """The routes served here, in policy order (Envoy takes the first match)."""
    limits: ListenerLimitsIR = ListenerLimitsIR()
