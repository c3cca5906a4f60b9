"""Semantic checks for ``rollouts``: each names a route of the policy and two of its backends,
walks strictly increasing steps, no route is moved by two rollouts at once (their weight
overrides would fight), a rollout's ``sticky`` agrees with its route's own ``hash``, and a
``backend-*`` metric reads services whose endpoints serve ``/metrics`` (HTTP, not gRPC)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping

from inferway.policies.model import Policy, Service
from inferway.policies.rollouts import METRIC_NEEDS, Rollout
from inferway.policies.traffic import HashOn
from inferway.policies.yaml_marks import Loc

__all__ = ["check_rollouts"]

_COMPARISONS = tuple(name for name, needs in METRIC_NEEDS.items() if needs == "max_increase")
"""Canary against stable (each may be given once)."""


def check_rollouts(policy: Policy) -> Iterator[tuple[Loc, str]]:
    routes = {r.name: r for r in policy.routes}
    services = [s.name for s in policy.services]
    by_name = {s.name: s for s in policy.services}
    names: dict[str, int] = {}
    on_route: dict[str, int] = {}
    for i, rollout in enumerate(policy.rollouts):
        loc: Loc = ("rollouts", i)
        if rollout.name in names:
            yield (
                (*loc, "name"),
                f"duplicate rollout name '{rollout.name}' (also rollouts[{names[rollout.name]}])",
            )
        names.setdefault(rollout.name, i)
        yield from _steps(loc, rollout)
        yield from _metrics(loc, rollout)
        if rollout.analysis.interval <= 0:
            yield (*loc, "analysis", "interval"), "the analysis interval must be above 0"
        route = routes.get(rollout.route)
        if route is None:
            yield (*loc, "route"), f"unknown route '{rollout.route}'{_hint(rollout.route, routes)}"
            continue
        if rollout.route in on_route:
            yield (
                (*loc, "route"),
                f"route '{rollout.route}' already has a rollout "
                f"(rollouts[{on_route[rollout.route]}]); one rollout per route, or their "
                "weights would fight",
            )
        on_route.setdefault(rollout.route, i)
        backends = [b.service for b in route.backends]
        for role in ("stable", "canary"):
            name = getattr(rollout, role)
            if name not in services:
                yield (*loc, role), f"unknown service '{name}'{_hint(name, services)}"
            elif name not in backends:
                yield (
                    (*loc, role),
                    f"{role} '{name}' is not a backend of route '{route.name}' (its backends: "
                    f"{', '.join(backends)}); add it to the route's backends",
                )
        if rollout.sticky is not None and route.hash is not None and route.hash != rollout.sticky:
            yield (
                (*loc, "sticky"),
                f"route '{route.name}' already hashes on {_hash_text(route.hash)}, the "
                f"rollout's sticky on {_hash_text(rollout.sticky)}; a route has one sticky "
                "hash: remove one of them, or make them the same",
            )
        if rollout.stable == rollout.canary:
            yield (*loc, "canary"), f"canary and stable are both '{rollout.canary}'"
        yield from _backend_metrics(loc, rollout, by_name)
        for m, metric in enumerate(rollout.analysis.metrics):
            mirror = route.mirror
            if metric.name == "output-agreement" and (
                mirror is None or mirror.service != rollout.canary
            ):
                yield (
                    (*loc, "analysis", "metrics", m, "via"),
                    f"output-agreement compares mirrored answers, but route '{route.name}' does "
                    f"not mirror to the canary '{rollout.canary}'; add "
                    f"'mirror: {{service: {rollout.canary}}}' to the route",
                )


def _steps(loc: Loc, rollout: Rollout) -> Iterator[tuple[Loc, str]]:
    for s in range(1, len(rollout.steps)):
        before, now = rollout.steps[s - 1].weight, rollout.steps[s].weight
        if now <= before:
            yield (
                (*loc, "steps", s),
                f"steps must increase: {now:g}% comes after {before:g}% (steps[{s - 1}])",
            )


def _metrics(loc: Loc, rollout: Rollout) -> Iterator[tuple[Loc, str]]:
    seen: dict[str, int] = {}
    for m, metric in enumerate(rollout.analysis.metrics):
        where = (*loc, "analysis", "metrics", m)
        if metric.name in seen and metric.name in _COMPARISONS:
            yield (
                (*where, "name"),
                f"metric {metric.name} is already given (metrics[{seen[metric.name]}])",
            )
        seen.setdefault(metric.name, m)
        big = metric.max_increase is not None and metric.max_increase >= 100
        if metric.name in ("error-rate", "backend-error-rate") and big:
            yield (*where, "max_increase"), "an error rate cannot grow by 100% or more"


def _backend_metrics(
    loc: Loc, rollout: Rollout, services: Mapping[str, Service]
) -> Iterator[tuple[Loc, str]]:
    """The backends' /metrics is plain HTTP on their HTTP port: an ``http2`` service's
    endpoints are gRPC ports (inferway's HTTP front speaks HTTP/1.1) and a ``tls`` one's
    speak TLS, where the gateway's scrape can only fail."""
    for m, metric in enumerate(rollout.analysis.metrics):
        if not metric.name.startswith("backend-"):
            continue
        where = (*loc, "analysis", "metrics", m, "name")
        instead = metric.name.removeprefix("backend-")
        for role in ("stable", "canary"):
            service = services.get(getattr(rollout, role))
            if service is None:
                continue
            if service.protocol == "http2":
                yield (
                    where,
                    f"{metric.name} scrapes the backends' /metrics on their HTTP port, but "
                    f"{role} '{service.name}' is protocol http2 (gRPC ports have no /metrics); "
                    f"use {instead} (Envoy's stats) for it",
                )
            elif service.tls is not None and service.tls.mode != "none":
                yield (
                    where,
                    f"{metric.name} scrapes the backends' /metrics over plain HTTP, but {role} "
                    f"'{service.name}' is reached over TLS; use {instead} (Envoy's stats) for it",
                )


def _hint(name: str, known: object) -> str:
    names = list(known)  # type: ignore[call-overload]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{hint}; known: {', '.join(names) if names else 'none defined'}"


def _hash_text(hash_on: HashOn) -> str:
    if hash_on.header is not None:
        return f"header '{hash_on.header}'"
    if hash_on.cookie is not None:
        return f"cookie '{hash_on.cookie.name}'"
    return "the client IP"
