"""IR -> Envoy v3 resources, as a pure function (no I/O, no clock, no randomness).

One module per Envoy feature (listener, route, cluster, endpoint), each a few ``build_*``
functions returning protos; this module only assembles them. The translator reads the IR
(:mod:`inferway.resolve.ir`) and decides nothing the IR already says: every default was
applied by ``resolve``. The same IR always gives byte-identical resources, so the cache can
version snapshots by content hash.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.message import Message

from inferway.resolve.ir import IR
from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.translate.cluster import build_cluster
from inferway.xds.translate.endpoint import build_cluster_load_assignment, uses_hostnames
from inferway.xds.translate.features import FEATURE_ROUTER_CLUSTER, build_feature_router_cluster
from inferway.xds.translate.listener import build_listener
from inferway.xds.translate.llm import (
    LLM_CLUSTER,
    LLM_REPORTS_CLUSTER,
    build_llm_cluster,
    build_llm_reports_cluster,
    drop_llm_filter_configs,
)
from inferway.xds.translate.observability import build_observability_clusters
from inferway.xds.translate.picker import (
    apply_picker_lb,
    apply_picker_routes,
    build_picker_clusters,
)
from inferway.xds.translate.route import build_route_configuration
from inferway.xds.translate.tls import build_secrets

__all__ = ["translate"]


def translate(ir: IR) -> Resources:
    """Listener + RouteConfiguration per listener, Cluster + ClusterLoadAssignment per
    service (a service with hostname endpoints gets a DNS cluster with the assignment
    inlined instead: EDS carries IP addresses only), one SDS Secret per secret in the IR.
    Cross-references (a route naming an unknown service) are the policy loader's checks;
    this function translates what it is given."""
    pickers = {s.name: s.picker for s in ir.services if s.picker is not None}
    route_configs = [(ln, build_route_configuration(ln)) for ln in ir.listeners]
    for ln, config in route_configs:
        apply_picker_routes(config, ln.routes, pickers)
        if ir.llm is not None and ir.llm.transport == "http":
            drop_llm_filter_configs(config)
    clusters = [build_cluster(s) for s in ir.services]
    for cluster in clusters:
        if cluster.name in pickers:
            apply_picker_lb(cluster, pickers[cluster.name])
    items: dict[str, Iterable[tuple[str, Message]]] = {
        type_urls.LISTENER: [
            (
                ln.name,
                build_listener(
                    ln,
                    observability=ir.observability,
                    feature_router=ir.feature_router,
                    llm=ir.llm,
                    pickers=pickers,
                ),
            )
            for ln in ir.listeners
        ],
        type_urls.ROUTE: [(ln.name, config) for ln, config in route_configs],
        type_urls.CLUSTER: [(c.name, c) for c in clusters]
        + [(c.name, c) for c in build_picker_clusters(list(pickers.values()))]
        + [(c.name, c) for c in build_observability_clusters(ir.observability)]
        + (
            [(FEATURE_ROUTER_CLUSTER, build_feature_router_cluster(ir.feature_router))]
            if ir.feature_router is not None
            else []
        )
        + (
            [
                (LLM_CLUSTER, build_llm_cluster(ir.llm)),
                (LLM_REPORTS_CLUSTER, build_llm_reports_cluster(ir.llm)),
            ]
            if ir.llm is not None
            else []
        ),
        type_urls.ENDPOINT: [
            (s.name, build_cluster_load_assignment(s)) for s in ir.services if not uses_hostnames(s)
        ],
    }
    if ir.secrets:
        items[type_urls.SECRET] = build_secrets(ir.secrets)
    return Resources.build(items)
