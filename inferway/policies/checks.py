"""Semantic checks: a policy that fits the schema can still not make sense.

Each check is a pure function over a validated :class:`Policy` returning ``(loc, message)``
pairs; the loader turns locs into file positions. These catch what Envoy would refuse (or
worse, accept and misroute): dangling references, clashing ports, routes that can never
match, a canary weight pointing at a service with no replicas.
"""

from __future__ import annotations

import difflib
import ipaddress
from collections.abc import Callable, Iterable, Iterator

from inferway.policies.checks_access import check_access
from inferway.policies.checks_cost import check_cost
from inferway.policies.checks_features import check_features
from inferway.policies.checks_grpc import check_grpc_targets
from inferway.policies.checks_llm import check_llm
from inferway.policies.checks_observability import check_observability
from inferway.policies.checks_picker import check_picker
from inferway.policies.checks_ports import check_ports
from inferway.policies.checks_ranges import check_ranges
from inferway.policies.checks_replicas import check_replicas
from inferway.policies.checks_rollouts import check_rollouts
from inferway.policies.checks_route_traffic import check_route_traffic
from inferway.policies.checks_tls import check_tls
from inferway.policies.checks_traffic import check_traffic
from inferway.policies.model import Listener, Policy, Route
from inferway.policies.types import RESERVED_NAME_PREFIX, join_host_port
from inferway.policies.yaml_marks import Loc, format_loc

__all__ = ["SemanticIssue", "check_policy"]

SemanticIssue = tuple[Loc, str]

_MAX_WEIGHT_TOTAL = 2**32 - 1
"""Route weights in permille must sum within a uint32 (Envoy gets them scaled to 10,000,
resolve/weights.py; the bound keeps the policy's numbers sane)."""


def check_policy(policy: Policy, *, external_endpoints: bool = False) -> list[SemanticIssue]:
    """Every semantic problem in ``policy``; empty when it makes sense.

    ``external_endpoints``: services' endpoints come from an endpoints file named outside the
    policy (``inferway run --endpoints-file``), so a service without inline ones is not empty.
    """
    issues: list[SemanticIssue] = list(_weights(policy, external_endpoints=external_endpoints))
    for check in _CHECKS:
        issues.extend(check(policy))
    return issues


def _duplicate_names(policy: Policy) -> Iterator[SemanticIssue]:
    kinds: list[tuple[str, str, Iterable[str]]] = [
        ("listeners", "listener", (x.name for x in policy.listeners)),
        ("services", "service", (x.name for x in policy.services)),
        ("routes", "route", (x.name for x in policy.routes)),
    ]
    for section, kind, names in kinds:
        first: dict[str, int] = {}
        for index, name in enumerate(names):
            if name in first:
                earlier = format_loc((section, first[name]))
                yield (section, index, "name"), f"duplicate {kind} name '{name}' (also {earlier})"
            else:
                first[name] = index


def _reserved_names(policy: Policy) -> Iterator[SemanticIssue]:
    for index, service in enumerate(policy.services):
        if service.name.startswith(RESERVED_NAME_PREFIX):
            yield (
                ("services", index, "name"),
                f"service name '{service.name}' is reserved: names starting with "
                f"'{RESERVED_NAME_PREFIX}' belong to inferway's own Envoy clusters "
                "(e.g. the tracing collector); rename the service",
            )


def _binds_overlap(a: Listener, b: Listener) -> bool:
    if a.port != b.port:
        return False
    ip_a, ip_b = ipaddress.ip_address(a.address), ipaddress.ip_address(b.address)
    if ip_a == ip_b:
        return True
    if ip_a.version != ip_b.version:
        return False
    return ip_a.is_unspecified or ip_b.is_unspecified


def _port_clashes(policy: Policy) -> Iterator[SemanticIssue]:
    for j, later in enumerate(policy.listeners):
        for i, earlier in enumerate(policy.listeners[:j]):
            if _binds_overlap(earlier, later):
                yield (
                    ("listeners", j, "port"),
                    f"listener '{later.name}' on {_bind(later)} clashes with listener "
                    f"'{earlier.name}' (listeners[{i}]) on {_bind(earlier)}: "
                    "both bind the same port",
                )
                break


def _bind(listener: Listener) -> str:
    if ":" in listener.address:
        return f"[{listener.address}]:{listener.port}"
    return f"{listener.address}:{listener.port}"


def _suggest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    listing = ", ".join(known) if known else "none defined"
    return f"{hint}; known: {listing}"


def _references(policy: Policy) -> Iterator[SemanticIssue]:
    services = list(dict.fromkeys(s.name for s in policy.services))
    listeners = list(dict.fromkeys(x.name for x in policy.listeners))
    for r, route in enumerate(policy.routes):
        for b, backend in enumerate(route.backends):
            if backend.service not in services:
                yield (
                    ("routes", r, "backends", b, "service"),
                    f"unknown service '{backend.service}'{_suggest(backend.service, services)}",
                )
        if route.listeners is not None:
            if not route.listeners:
                yield (
                    ("routes", r, "listeners"),
                    "an empty list serves this route on no listener; "
                    "leave 'listeners' out to serve it on every listener",
                )
            for i, name in enumerate(route.listeners):
                if name not in listeners:
                    yield (
                        ("routes", r, "listeners", i),
                        f"unknown listener '{name}'{_suggest(name, listeners)}",
                    )


def _weights(policy: Policy, *, external_endpoints: bool = False) -> Iterator[SemanticIssue]:
    by_name = {s.name: s for s in policy.services}
    for r, route in enumerate(policy.routes):
        total = sum(b.permille for b in route.backends)
        if total == 0:
            yield (
                ("routes", r, "backends"),
                f"all backend weights are 0, so route '{route.name}' sends traffic nowhere; "
                "give at least one backend a weight above 0",
            )
        elif total > _MAX_WEIGHT_TOTAL:
            yield (
                ("routes", r, "backends"),
                f"backend weights add up to {total / 10:g}, more than Envoy can take "
                f"({_MAX_WEIGHT_TOTAL / 10:g}); weights are relative, use smaller numbers",
            )
        seen: dict[str, int] = {}
        for b, backend in enumerate(route.backends):
            if backend.service in seen:
                yield (
                    ("routes", r, "backends", b, "service"),
                    f"service '{backend.service}' is already a backend of this route "
                    f"(backends[{seen[backend.service]}]); combine the weights into one entry",
                )
            seen.setdefault(backend.service, b)
            service = by_name.get(backend.service)
            # endpoints arrive from an endpoints file (the policy's, or the command line's)
            external = external_endpoints or policy.endpoints_file is not None
            if service is not None and not service.endpoints and backend.permille > 0:
                if external or service.replicas is not None:  # replicas: the manager's
                    continue
                yield (
                    ("routes", r, "backends", b, "weight"),
                    f"service '{service.name}' has no endpoints, so its weight "
                    f"{backend.weight:g} would fail those requests; add endpoints to the "
                    "service or set this weight to 0",
                )


def _endpoints(policy: Policy) -> Iterator[SemanticIssue]:
    for s, service in enumerate(policy.services):
        first: dict[tuple[str, int], int] = {}
        for e, endpoint in enumerate(service.endpoints):
            key = (endpoint.host.lower(), endpoint.port)
            if key in first:
                yield (
                    ("services", s, "endpoints", e),
                    f"duplicate endpoint {_host_port(endpoint.host, endpoint.port)} "
                    f"(also endpoints[{first[key]}])",
                )
            else:
                first[key] = e


def _host_port(host: str, port: int) -> str:
    return join_host_port(host, port)


def _retries(policy: Policy) -> Iterator[SemanticIssue]:
    for r, route in enumerate(policy.routes):
        retries = route.retries
        if retries is None:
            continue
        loc: Loc = ("routes", r, "retries")
        uses_codes = "retriable-status-codes" in retries.on
        if uses_codes and not retries.retriable_status_codes:
            yield (
                (*loc, "retriable_status_codes"),
                "'on' includes 'retriable-status-codes' but no retriable_status_codes are "
                "given; list the codes, e.g. retriable_status_codes: [503]",
            )
        if retries.retriable_status_codes and not uses_codes:
            yield (
                (*loc, "on"),
                "retriable_status_codes are given but 'on' does not include "
                "'retriable-status-codes', so they would be ignored; add it to 'on'",
            )
        per_try = retries.per_try_timeout
        if per_try is not None and route.timeout > 0 and per_try > route.timeout:
            yield (
                (*loc, "per_try_timeout"),
                f"per_try_timeout {per_try:g}s is longer than the route timeout "
                f"{route.timeout:g}s, so no retry could ever happen; make it shorter",
            )


def _catches_all(route: Route) -> bool:
    match = route.match
    return (
        match.path.prefix == "/"
        and not match.headers
        and not match.cookies
        and match.features is None
        and route.openai is None  # its paths are the OpenAI endpoints, whatever match says
    )


def _shadowed_routes(policy: Policy) -> Iterator[SemanticIssue]:
    every = [x.name for x in policy.listeners]

    def served_on(route: Route) -> set[str]:
        return set(every if route.listeners is None else route.listeners)

    for j, later in enumerate(policy.routes):
        for i, earlier in enumerate(policy.routes[:j]):
            shared = served_on(earlier) & served_on(later)
            if _catches_all(earlier) and shared:
                yield (
                    ("routes", j),
                    f"route '{later.name}' can never match: route '{earlier.name}' "
                    f"(routes[{i}]) comes first and matches every request on listener "
                    f"'{sorted(shared)[0]}'; move '{later.name}' above it",
                )
                break


_CHECKS: list[Callable[[Policy], Iterable[SemanticIssue]]] = [
    _duplicate_names,
    _reserved_names,
    _port_clashes,
    _references,
    _endpoints,
    _retries,
    _shadowed_routes,
    check_access,
    check_observability,
    check_ranges,
    check_replicas,
    check_tls,
    check_traffic,
    check_grpc_targets,
    check_route_traffic,
    check_rollouts,
    check_cost,
    check_features,
    check_llm,
    check_picker,
    check_ports,
]
