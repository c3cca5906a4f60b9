"""IR of a proxyless gRPC target: the name a client dials (``xds:///<name>``) and the routes
it gets, resolved exactly as Envoy's are (weight overrides applied)."""

from __future__ import annotations

from dataclasses import dataclass

from inferway.resolve.ir.route import RouteIR

__all__ = ["GrpcTargetIR"]


@dataclass(frozen=True)
class GrpcTargetIR:
    name: str
    routes: tuple[RouteIR, ...]
    """One route: the named policy route, or a catch-all to the named service."""

    @property
    def services(self) -> tuple[str, ...]:
        """Every service this target can send to, in route and backend order, once each."""
        names = (b.service for r in self.routes for b in r.backends)
        return tuple(dict.fromkeys(names))
