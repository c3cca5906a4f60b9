"""``resolve_policy``: the one place the policy meets runtime State and defaults are applied.

The policy is what the user wrote; State is what arrives while it runs (endpoints, TLS
material, weight overrides, replicas). The result, the IR, is everything the translator
needs and nothing it has to decide.
"""

from __future__ import annotations

from inferway.observability.redaction import CREDENTIAL_HEADERS
from inferway.policies.model import Listener, Policy, Route, Service
from inferway.policies.rollouts import Rollout
from inferway.resolve.canary_match import resolve_canary_routes
from inferway.resolve.endpoints import resolve_endpoints, resolve_localities
from inferway.resolve.features import resolve_feature_router
from inferway.resolve.grpc_targets import resolve_grpc_target
from inferway.resolve.ir import IR
from inferway.resolve.ir.listener import ListenerIR, ListenerLimitsIR
from inferway.resolve.ir.route import RouteIR
from inferway.resolve.ir.service import ServiceIR
from inferway.resolve.llm import llm_health_paths, resolve_llm_gateway
from inferway.resolve.observability import resolve_observability
from inferway.resolve.picker import resolve_picker
from inferway.resolve.routes import resolve_route
from inferway.resolve.secrets import resolve_downstream_tls, resolve_secrets, resolve_upstream_tls
from inferway.resolve.traffic import (
    resolve_circuit_breakers,
    resolve_health_check,
    resolve_load_balancing,
    resolve_outlier_detection,
    resolve_tcp_keepalive,
)
from inferway.state.model import State

__all__ = ["resolve_listener", "resolve_policy", "resolve_service"]


def resolve_policy(policy: Policy, state: State | None = None) -> IR:
    """Raises ResolveError when State contradicts the policy (a bad weight override)."""
    state = state or State()
    services = {s.name: s for s in policy.services}
    rollouts = {r.route: r for r in policy.rollouts}
    resolved = [
        (
            r,
            resolve_route(
                _with_sticky(r, rollouts.get(r.name)),
                services,
                state.weights.get(r.name),
                served_by_headers=policy.served_by_headers,
                rate_shares=state.rate_shares.get(r.name),
            ),
        )
        for r in policy.routes
    ]
    routes: list[tuple[Route, RouteIR]] = []
    for route, ir in resolved:
        if route.name in rollouts:  # the canary's forced routes go first, or they never match
            routes.extend(
                (route, forced) for forced in resolve_canary_routes(ir, rollouts[route.name])
            )
        routes.append((route, ir))
    by_name = {route.name: ir for route, ir in routes}
    health_paths = llm_health_paths(policy)
    return IR(
        listeners=tuple(
            resolve_listener(ln, [ir for route, ir in routes if _served_on(route, ln)])
            for ln in policy.listeners
        ),
        services=tuple(
            resolve_service(s, state, health_path=health_paths.get(s.name)) for s in policy.services
        ),
        observability=resolve_observability(policy.observability, policy.mask),
        secrets=resolve_secrets(policy, state),
        redacted_headers=tuple(
            sorted({*CREDENTIAL_HEADERS, *(h.lower() for h in policy.redact_headers)})
        ),
        grpc_targets=tuple(resolve_grpc_target(t, by_name, services) for t in policy.grpc_targets),
        feature_router=resolve_feature_router(policy.feature_router, by_name.values()),
        llm=resolve_llm_gateway(policy.llm, by_name.values()),
    )


def _with_sticky(route: Route, rollout: Rollout | None) -> Route:
    """A rollout's ``sticky`` is its route's ``hash`` (the checks refused a different one), so
    the route gets the hash policy and ``use_hash_policy`` like a route-level ``hash``."""
    if rollout is None or rollout.sticky is None or route.hash is not None:
        return route
    return route.model_copy(update={"hash": rollout.sticky})


def _served_on(route: Route, listener: Listener) -> bool:
    """A route without ``listeners`` is served on every listener."""
    return route.listeners is None or listener.name in route.listeners


def resolve_listener(listener: Listener, routes: list[RouteIR]) -> ListenerIR:
    """``routes``: the resolved routes served on ``listener``, in policy order."""
    return ListenerIR(
        name=listener.name,
        address=listener.address,
        port=listener.port,
        tls=resolve_downstream_tls(listener),
        routes=tuple(routes),
        limits=ListenerLimitsIR(
            request_headers_timeout_s=listener.limits.request_headers_timeout,
            stream_idle_timeout_s=listener.limits.stream_idle_timeout,
            request_timeout_s=listener.limits.request_timeout,
            max_request_bytes=listener.limits.max_request_bytes,
        ),
    )


def resolve_service(service: Service, state: State, *, health_path: str | None = None) -> ServiceIR:
    """``health_path``: where its default readiness probe asks (None: /v2/health/ready)."""
    endpoints = resolve_endpoints(service, state)
    zones = service.load_balancing.zones if service.load_balancing else None
    return ServiceIR(
        name=service.name,
        protocol=service.protocol,
        connect_timeout=service.connect_timeout,
        localities=resolve_localities(
            endpoints, zones, state.saturated.get(service.name, frozenset())
        ),
        load_balancing=resolve_load_balancing(service, endpoints),
        health_check=resolve_health_check(service.protocol, service.health_check, health_path),
        outlier_detection=resolve_outlier_detection(service.outlier_detection),
        circuit_breakers=resolve_circuit_breakers(service.circuit_breakers),
        tls=resolve_upstream_tls(service),
        tcp_keepalive=resolve_tcp_keepalive(service.tcp_keepalive),
        picker=resolve_picker(
            service.name, service.picker, endpoints, state.picker_load.get(service.name)
        ),
    )
