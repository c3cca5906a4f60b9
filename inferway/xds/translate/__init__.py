"""Policy -> Envoy v3 resources, as a pure function (no I/O, no clock, no randomness).

One module per Envoy feature (listener, route, cluster, endpoint), each a few ``build_*``
functions returning protos; this module only assembles them. The same policy always gives
byte-identical resources, so the cache can version snapshots by content hash.
"""

from __future__ import annotations

from inferway.policies.model import Policy
from inferway.policies.resolve import Resolved
from inferway.xds import type_urls
from inferway.xds.resources import Resources
from inferway.xds.translate import names
from inferway.xds.translate.cluster import build_cluster
from inferway.xds.translate.endpoint import build_cluster_load_assignment, uses_hostnames
from inferway.xds.translate.listener import build_listener
from inferway.xds.translate.observability import build_observability_clusters
from inferway.xds.translate.route import build_route_configuration
from inferway.xds.translate.tls import build_secrets, referenced_secret_names

__all__ = ["translate_policy", "translate_resolved"]


def translate_policy(policy: Policy) -> Resources:
    """Listener + RouteConfiguration per policy listener, Cluster + ClusterLoadAssignment per
    service (a service with hostname endpoints gets a DNS cluster with the assignment
    inlined instead: EDS carries IP addresses only). Cross-references (a route naming an
    unknown service or listener) are the policy loader's checks; this function translates
    what it is given."""
    return Resources.build(
        {
            type_urls.LISTENER: [
                (
                    names.listener_name(ln),
                    build_listener(ln, routes=policy.routes, observability=policy.observability),
                )
                for ln in policy.listeners
            ],
            type_urls.ROUTE: [
                (
                    names.route_config_name(ln),
                    build_route_configuration(ln, policy.routes, policy.services),
                )
                for ln in policy.listeners
            ],
            type_urls.CLUSTER: [(names.cluster_name(s), build_cluster(s)) for s in policy.services]
            + [(c.name, c) for c in build_observability_clusters(policy.observability)],
            type_urls.ENDPOINT: [
                (names.cluster_name(s), build_cluster_load_assignment(s))
                for s in policy.services
                if not uses_hostnames(s)
            ],
        }
    )


def translate_resolved(resolved: Resolved) -> Resources:
    """The IR (policy merged with runtime sources) -> Envoy resources, plus one SDS Secret per
    secret the policy refers to (material for names it no longer uses is left out)."""
    resources = translate_policy(resolved.policy)
    wanted = referenced_secret_names(resolved.policy)
    secrets = {name: m for name, m in resolved.secrets.items() if name in wanted}
    if not secrets:
        return resources
    return Resources.build(
        {
            **{t: list(resources.of_type(t).items()) for t in resources.by_type},
            type_urls.SECRET: build_secrets(secrets),
        }
    )
