"""A route's backend weights: the policy's, with the rollout controller's override from
State on top. The override names services of the route; a backend it does not name keeps
its policy weight. An override for a route the policy no longer has is stale state and is
ignored (as endpoints for a removed service are)."""

from __future__ import annotations

from collections.abc import Mapping

from inferway.policies.model import Route
from inferway.resolve.errors import ResolveError
from inferway.resolve.ir.route import BackendIR

__all__ = ["resolve_backends", "weight_permille"]


def weight_permille(weight: float, where: str) -> int:
    """A 0.1-resolution percentage as tenths of a percent; ResolveError naming ``where``."""
    if weight < 0 or abs(weight * 10 - round(weight * 10)) > 1e-6:
        raise ResolveError(
            f"{where}: expected a weight >= 0 with 0.1 resolution (e.g. 99.9), got {weight:g}"
        )
    return round(weight * 10)


def resolve_backends(route: Route, override: Mapping[str, float] | None) -> tuple[BackendIR, ...]:
    override = override or {}
    names = [b.service for b in route.backends]
    unknown = sorted(set(override) - set(names))
    if unknown:
        raise ResolveError(
            f"weight override for route '{route.name}': {', '.join(unknown)} "
            f"{'is' if len(unknown) == 1 else 'are'} not a backend of the route "
            f"(its backends: {', '.join(names)})"
        )
    return tuple(
        BackendIR(
            service=b.service,
            permille=(
                weight_permille(override[b.service], f"weight override {route.name}/{b.service}")
                if b.service in override
                else b.permille
            ),
        )
        for b in route.backends
    )
