"""A service's endpoints after every source is merged, grouped into weighted localities.

Order of precedence: endpoints from State (an endpoints file or discovery) replace the
policy's inline list; replicas from State (started at runtime) are added to that; a replica
already present (same host and port) is not added twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby

from inferway.policies.model import Endpoint, Service
from inferway.resolve.ir.service import EndpointIR, LocalityIR
from inferway.state.model import State

__all__ = ["resolve_endpoints", "resolve_localities"]


def resolve_endpoints(service: Service, state: State) -> list[Endpoint]:
    base = state.endpoints.get(service.name)
    merged = list(service.endpoints if base is None else base)
    seen = {(e.host.lower(), e.port) for e in merged}
    for replica in state.replicas.get(service.name, ()):
        key = (replica.host.lower(), replica.port)
        if key not in seen:
            seen.add(key)
            merged.append(replica)
    return merged


def resolve_localities(
    endpoints: list[Endpoint],
    zone_weights: Mapping[str, int] | None,
    degraded: frozenset[tuple[str, int]] = frozenset(),
) -> tuple[LocalityIR, ...]:
    """Localities sorted by (priority, zone), endpoints by (host, port): reordering replicas
    does not change the content hash. A zone's weight is its configured one, else the sum of
    its endpoints' weights (a zone the policy does not name also gets the sum: endpoints can
    come from a source the policy file never saw). Endpoints whose (host, port) is in
    ``degraded`` are marked so."""

    def locality_key(e: Endpoint) -> tuple[int, str]:
        return e.priority, e.zone or ""

    zones = zone_weights or {}
    ordered = sorted(endpoints, key=lambda e: (*locality_key(e), e.host, e.port))
    localities: list[LocalityIR] = []
    for (priority, zone), group in groupby(ordered, key=locality_key):
        listed = list(group)
        members = tuple(
            EndpointIR(e.host, e.port, e.weight, (e.host, e.port) in degraded) for e in listed
        )
        localities.append(
            LocalityIR(
                priority=priority,
                zone=zone,
                weight=zones.get(zone, sum(e.weight for e in members)),
                endpoints=members,
                region=next((e.region for e in listed if e.region), ""),
            )
        )
    return tuple(localities)
