"""Proxyless gRPC targets: services exposed to gRPC clients that read xDS themselves.

A grpcio / grpc-java / grpc-go client dialing ``xds:///NAME`` asks the control plane for a
listener called NAME and balances across the replicas itself, with no Envoy in the path.
``grpc_targets`` names what such a client may reach: a route (its match and weighted
backends, weight overrides included) or a single service. Envoy is bypassed, so anything
only Envoy enforces (access rules, rate limits, upstream TLS) is refused on a target rather
than silently dropped (``checks_grpc``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, model_validator

from inferway.policies.types import Name

__all__ = ["GrpcTarget"]


class GrpcTarget(BaseModel):
    """``xds:///<name>`` reaches ``route`` (its backends, by weight) or ``service``."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=True, allow_inf_nan=False
    )

    name: Name
    route: str | None = None
    service: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> GrpcTarget:
        given = [k for k in ("route", "service") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of route or service (got {', '.join(given) or 'none'})"
            )
        return self
