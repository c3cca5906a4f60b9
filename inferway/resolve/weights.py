"""A route's backend weights: the policy's, with the rollout controller's override from
State on top, normalized to parts of WEIGHT_TOTAL (10,000). The override names services of
the route; a backend it does not name keeps its policy weight. An override for a route the
policy no longer has is stale state and is ignored (as endpoints for a removed service are).

Weights are relative in the policy (``99.9`` / ``0.1``, or ``1`` / ``1``); Envoy gets them
scaled to a constant total, so a sticky split keeps its cohort as a canary grows (a hash
lands on the same slice of 0..10,000 whatever the other weights are, ENVOY_NOTES)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from inferway.policies.model import Route
from inferway.resolve.errors import ResolveError
from inferway.resolve.ir.route import WEIGHT_TOTAL, BackendIR

__all__ = ["normalize_weights", "resolve_backends", "weight_permille"]


def weight_permille(weight: float, where: str) -> int:
    """A 0.1-resolution percentage as tenths of a percent; ResolveError naming ``where``."""
    if weight < 0 or abs(weight * 10 - round(weight * 10)) > 1e-6:
        raise ResolveError(
            f"{where}: expected a weight >= 0 with 0.1 resolution (e.g. 99.9), got {weight:g}"
        )
    return round(weight * 10)


def normalize_weights(permille: Sequence[int], total: int = WEIGHT_TOTAL) -> list[int]:
    """Relative integer weights as parts of ``total`` adding up to exactly ``total``
    (largest remainder, ties to the earlier backend). Weights that already add up to 100%
    (1000 permille) scale exactly: 999/1 -> 9990/10."""
    given = sum(permille)
    if given <= 0:
        raise ValueError("weights add up to 0")
    floors = [w * total // given for w in permille]
    remainders = sorted(range(len(permille)), key=lambda i: (-(permille[i] * total % given), i))
    for i in remainders[: total - sum(floors)]:
        floors[i] += 1
    return floors


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
    permille = [
        weight_permille(override[b.service], f"weight override {route.name}/{b.service}")
        if b.service in override
        else b.permille
        for b in route.backends
    ]
    if sum(permille) == 0:
        raise ResolveError(
            f"weights of route '{route.name}' add up to 0 (with the override from State), "
            "so it would send traffic nowhere; give one backend a weight above 0"
        )
    return tuple(
        BackendIR(service=b.service, weight=w)
        for b, w in zip(route.backends, normalize_weights(permille), strict=True)
    )
