"""Semantic checks for ``grpc_targets``: each names a known route or service, and what it
reaches is something a proxyless gRPC client can use as the policy means it.

The client talks to the replicas directly, so whatever only Envoy applies (access rules, rate
limits, mirrors, faults, sticky splits, upstream TLS) would be bypassed: such a target is
refused, not quietly weakened.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from inferway.policies.grpc_targets import GrpcTarget
from inferway.policies.model import Policy, Service
from inferway.policies.types import is_ip_address
from inferway.policies.yaml_marks import Loc

__all__ = ["check_grpc_targets"]


def check_grpc_targets(policy: Policy) -> Iterator[tuple[Loc, str]]:
    routes = {r.name: r for r in policy.routes}
    services = {s.name: s for s in policy.services}
    first: dict[str, int] = {}
    for t, target in enumerate(policy.grpc_targets):
        loc: Loc = ("grpc_targets", t)
        if target.name in first:
            yield (
                (*loc, "name"),
                f"duplicate grpc target name '{target.name}' "
                f"(also grpc_targets[{first[target.name]}])",
            )
        first.setdefault(target.name, t)
        if target.route is not None:
            route = routes.get(target.route)
            if route is None:
                yield (*loc, "route"), _unknown("route", target.route, list(routes))
                continue
            for what in ("access", "rate_limit", "mirror", "fault", "hash"):
                if getattr(route, what) is not None:
                    yield (
                        (*loc, "route"),
                        f"route '{route.name}' has {what}, which only Envoy applies; a "
                        "proxyless client calls the backends directly and would bypass it. "
                        "Expose a route without it, or call this route through Envoy",
                    )
            wanted = [b.service for b in route.backends]
        else:
            assert target.service is not None  # GrpcTarget guarantees exactly one
            if target.service not in services:
                yield (*loc, "service"), _unknown("service", target.service, list(services))
                continue
            wanted = [target.service]
        for name in dict.fromkeys(wanted):
            if name in services:  # an unknown backend is the route check's error
                yield from _check_service((*loc, _field(target)), services[name])


def _field(target: GrpcTarget) -> str:
    return "route" if target.route is not None else "service"


def _unknown(kind: str, name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown {kind} '{name}'{hint}; known: {', '.join(known) or 'none defined'}"


def _check_service(loc: Loc, service: Service) -> Iterator[tuple[Loc, str]]:
    if service.protocol != "http2":
        yield (
            loc,
            f"service '{service.name}' speaks {service.protocol}; gRPC needs HTTP/2, so the "
            "services a grpc target reaches must say protocol: http2",
        )
    if service.tls is not None:
        yield (
            loc,
            f"service '{service.name}' uses upstream tls, which only Envoy applies; a "
            "proxyless client would connect in plaintext. Expose a service without tls",
        )
    for e, endpoint in enumerate(service.endpoints):
        if not is_ip_address(endpoint.host):
            yield (
                loc,
                f"service '{service.name}' endpoints[{e}] is the hostname '{endpoint.host}'; "
                "proxyless clients take IP addresses only (EDS), give an IP address",
            )
            break
