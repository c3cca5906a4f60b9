"""The split each route of a snapshot sends to its clusters, read from the RouteConfigurations
the snapshot serves (RDS), not from the policy: what an Envoy of that snapshot's group was
actually sent. ``GET /status`` shows it per group, and ``inferway verify`` checks each Envoy of
a fleet against its own group's split (docs/verify.md)."""

from __future__ import annotations

from typing import Any

from inferway.xds import type_urls
from inferway.xds.snapshot import Snapshot

__all__ = ["RouteWeights", "served_route_weights"]

RouteWeights = dict[str, dict[str, dict[str, float]]]
"""route configuration (the listener's name) -> route -> cluster -> percent of the route."""


def _route_split(action: Any) -> dict[str, float] | None:
    """One RouteAction's split in percent (None: the route forwards to no cluster)."""
    if action.cluster:
        return {action.cluster: 100.0}
    if not action.HasField("weighted_clusters"):
        return None
    weights = {c.name: float(c.weight.value) for c in action.weighted_clusters.clusters}
    total = sum(weights.values())
    if total <= 0:
        return None
    return {name: round(100.0 * weight / total, 3) for name, weight in weights.items()}


def served_route_weights(snapshot: Snapshot | None) -> RouteWeights:
    """Every named route that forwards to clusters, per route configuration; redirects,
    direct responses and unnamed routes are left out (verify judges them otherwise)."""
    out: RouteWeights = {}
    if snapshot is None:
        return out
    for config_name, config in sorted(snapshot.resources_of(type_urls.ROUTE).items()):
        routes: dict[str, dict[str, float]] = {}
        for host in config.virtual_hosts:  # type: ignore[attr-defined]
            for route in host.routes:
                if not route.name or not route.HasField("route"):
                    continue
                split = _route_split(route.route)
                if split is not None:
                    routes.setdefault(route.name, split)
        out[config_name] = routes
    return out
