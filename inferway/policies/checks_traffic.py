"""Semantic checks of the traffic settings (load balancing, health checks): settings that
fit the schema but would be ignored by Envoy or silently misroute."""

from __future__ import annotations

from collections.abc import Iterator

from inferway.policies.model import Endpoint, Policy
from inferway.policies.traffic import LoadBalancing
from inferway.policies.yaml_marks import Loc

__all__ = ["check_traffic"]

_HASHING = ("ring_hash", "maglev")


def check_traffic(policy: Policy) -> Iterator[tuple[Loc, str]]:
    for s, service in enumerate(policy.services):
        lb = service.load_balancing
        if lb is not None:
            loc: Loc = ("services", s, "load_balancing")
            if lb.hash_on is not None and lb.policy not in _HASHING:
                yield (
                    (*loc, "hash_on"),
                    f"hash_on only works with policy ring_hash or maglev, not {lb.policy}; "
                    "set policy: ring_hash (or maglev), or remove hash_on",
                )
            yield from _zone_weights(service.name, service.endpoints, lb, loc)
        yield from _zone_regions(service.endpoints, ("services", s, "endpoints"))
        check = service.health_check
        if check is not None and check.enabled:
            loc = ("services", s, "health_check")
            if check.timeout is not None and check.timeout > check.interval:
                yield (
                    (*loc, "timeout"),
                    f"timeout {check.timeout:g}s is longer than interval {check.interval:g}s; "
                    "a probe would still be running when the next one starts",
                )
            if check.type == "grpc" and service.protocol != "http2":
                yield (
                    (*loc, "type"),
                    "gRPC health checks need an HTTP/2 service; set the service's "
                    "protocol: http2, or use type: http",
                )


def _zone_weights(
    service: str, endpoints: list[Endpoint], lb: LoadBalancing, loc: Loc
) -> Iterator[tuple[Loc, str]]:
    zones = lb.zones
    if not zones or not endpoints:
        return  # endpoints may come from a runtime source: nothing to compare with here
    used = sorted({e.zone for e in endpoints if e.zone is not None})
    if not used:
        yield (
            (*loc, "zones"),
            f"zone weights are given but no endpoint of service '{service}' has a zone; "
            "give each endpoint a zone",
        )
        return
    for zone in zones:
        if zone not in used:
            yield (
                (*loc, "zones", zone),
                f"no endpoint of service '{service}' is in zone '{zone}'; "
                f"its zones: {', '.join(used)}",
            )
    # Zone weights compete only within a priority tier: a tier whose zones are all unnamed
    # (e.g. a DR tier) keeps its endpoint sums; a tier mixing named and unnamed zones would
    # compare configured weights with endpoint sums, which is never what was meant.
    weighted_tiers = {e.priority for e in endpoints if e.zone in zones}
    missing = sorted(
        {e.zone for e in endpoints if e.zone is not None and e.zone not in zones}
        & {e.zone for e in endpoints if e.priority in weighted_tiers}
    )
    if missing:
        yield (
            (*loc, "zones"),
            f"zone(s) {', '.join(missing)} of service '{service}' have no weight here; "
            "give every zone a weight (or leave zones out to weight zones by their endpoints)",
        )


def _zone_regions(endpoints: list[Endpoint], loc: Loc) -> Iterator[tuple[Loc, str]]:
    """A zone lies in one region: an Envoy ranks a zone by its region (zones.py), so a zone
    named with two regions would be ranked by whichever came first."""
    regions: dict[str, tuple[int, str]] = {}
    for e, endpoint in enumerate(endpoints):
        if endpoint.region is None:
            continue
        if endpoint.zone is None:
            yield (
                (*loc, e, "region"),
                "region is given without a zone; give the endpoint's zone too",
            )
            continue
        first = regions.setdefault(endpoint.zone, (e, endpoint.region))
        if first[1] != endpoint.region:
            yield (
                (*loc, e, "region"),
                f"zone '{endpoint.zone}' is in region '{first[1]}' (endpoint {first[0]}), not "
                f"'{endpoint.region}'; a zone lies in one region",
            )
