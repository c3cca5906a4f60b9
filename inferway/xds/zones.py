"""Zone-aware routing: the IR one Envoy sees, with each service's priorities recomputed from
that Envoy's own locality (``node.locality``: ``inferway envoy --zone --region``).

Why per-node priorities and not Envoy's zone-aware load balancing: Envoy's zone-aware LB
routes by the *local cluster*'s membership (every Envoy of the fleet listed as a cluster, the
same on every side), and it turns itself off below ``min_cluster_size`` (6 hosts) and
whenever the upstream zone holds less capacity than the local one, silently spreading traffic
across zones. A fleet of two gateways in two zones never meets those conditions. Priorities
are exact: the node's own zone is tier 0 and takes all traffic while healthy (by the
service's ``overprovisioning_factor``); spill goes to the node's region, then everything
else, by the same health rules every tier already follows, and a retry moves to the next
tier (``previous_priorities``) when its zone goes silent.

For a policy priority ``p`` and a locality of rank ``r`` (0: the node's zone, 1: the node's
region, 2: elsewhere or unknown), the node's priority is the dense rank of ``(p, r)``, so a
policy's DR tier (priority 1) still comes after every zone of tier 0. A service whose
endpoints name no zone is left as it is. The transform is pure and depends only on the
node's (region, zone), so every node of a zone shares one snapshot (``node_groups``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from inferway.resolve.ir import IR
from inferway.resolve.ir.service import LocalityIR, ServiceIR

__all__ = ["NodeLocality", "locality_rank", "localize_ir", "localize_service"]

_OWN_ZONE, _OWN_REGION, _ELSEWHERE = 0, 1, 2


@dataclass(frozen=True)
class NodeLocality:
    """Where an Envoy runs; empty strings: not said."""

    region: str = ""
    zone: str = ""

    def __bool__(self) -> bool:
        return bool(self.region or self.zone)


def locality_rank(locality: LocalityIR, node: NodeLocality) -> int:
    """0: the node's zone (same region, or no region said on either side), 1: the node's
    region, 2: anywhere else (an endpoint without a zone included)."""
    same_region = not (node.region and locality.region) or node.region == locality.region
    if node.zone and locality.zone == node.zone and same_region:
        return _OWN_ZONE
    if node.region and locality.region == node.region:
        return _OWN_REGION
    return _ELSEWHERE


def localize_service(service: ServiceIR, node: NodeLocality) -> ServiceIR:
    """``service`` as ``node`` sees it: localities re-prioritised (own zone first), sorted by
    (new priority, zone) so the content hash depends only on what each tier holds."""
    if not node or not any(loc.zone or loc.region for loc in service.localities):
        return service
    keys = {id(loc): (loc.priority, locality_rank(loc, node)) for loc in service.localities}
    dense = {key: index for index, key in enumerate(sorted(set(keys.values())))}
    localities = sorted(
        (replace(loc, priority=dense[keys[id(loc)]]) for loc in service.localities),
        key=lambda loc: (loc.priority, loc.zone),
    )
    return replace(service, localities=tuple(localities))


def localize_ir(ir: IR, node: NodeLocality) -> IR:
    """``ir`` with every zoned service localized for ``node``; ``ir`` itself when nothing
    changes (a node without a locality, or a policy without zones)."""
    services = tuple(localize_service(s, node) for s in ir.services)
    if all(new is old for new, old in zip(services, ir.services, strict=True)):
        return ir
    return replace(ir, services=services)
