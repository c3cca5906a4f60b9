"""A rollout's ``match``: requests with those headers always reach the canary (testers try
it at any weight). Each ``match`` entry becomes a route placed just before the rollout's
route, with that route's path and headers plus the entry's, and the canary as sole backend."""

from __future__ import annotations

from dataclasses import replace

from inferway.policies.rollouts import CanaryHeader, Rollout
from inferway.resolve.ir.route import WEIGHT_TOTAL, BackendIR, HeaderMatchIR, RouteIR

__all__ = ["resolve_canary_routes"]


def _header(header: CanaryHeader) -> HeaderMatchIR:
    return HeaderMatchIR(
        name=header.name,
        invert=False,
        exact=header.exact,
        prefix=header.prefix,
        present=header.present,
    )


def resolve_canary_routes(route: RouteIR, rollout: Rollout) -> tuple[RouteIR, ...]:
    return tuple(
        replace(
            route,
            name=f"{route.name}-canary-{i}",
            match=replace(
                route.match,
                headers=route.match.headers + tuple(_header(h) for h in entry.headers),
            ),
            backends=(BackendIR(service=rollout.canary, weight=WEIGHT_TOTAL),),
            sticky=False,
            mirror=None,  # a tester's request is the canary's already; no shadow copy of it
        )
        for i, entry in enumerate(rollout.match)
    )
