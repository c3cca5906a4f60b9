"""Envoy v3 xDS type URLs, in one place (go-control-plane's resource/v3 convention)."""

from typing import Final

__all__ = [
    "CLUSTER",
    "ENDPOINT",
    "LISTENER",
    "PUSH_ORDER",
    "REMOVE_LAST",
    "ROUTE",
    "SECRET",
    "SHORT_NAMES",
]

_PREFIX: Final = "type.googleapis.com/"
LISTENER: Final = _PREFIX + "envoy.config.listener.v3.Listener"
ROUTE: Final = _PREFIX + "envoy.config.route.v3.RouteConfiguration"
CLUSTER: Final = _PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT: Final = _PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
SECRET: Final = _PREFIX + "envoy.extensions.transport_sockets.tls.v3.Secret"

# Make-before-break (xDS protocol, "Eventual consistency considerations"): additions and updates
# go clusters and their endpoints before the listeners and routes that use them; removals go the
# other way, so these types' removals wait until the listeners and routes no longer use them.
PUSH_ORDER: Final = (CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET)
REMOVE_LAST: Final = (CLUSTER, ENDPOINT, SECRET)

SHORT_NAMES: Final = {
    LISTENER: "listeners",
    ROUTE: "routes",
    CLUSTER: "clusters",
    ENDPOINT: "endpoints",
    SECRET: "secrets",
}
