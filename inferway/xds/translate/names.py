"""Envoy extension names and the resource-naming rules of the translator, in one place.

The contract (see CONTRACTS.md) is that every Envoy name equals the policy name it comes
from, so a person reading Envoy stats or admin output finds the policy entry directly.
"""

from typing import Final

from inferway.policies.model import Listener, Service

__all__ = [
    "HCM_FILTER",
    "HTTP_PROTOCOL_OPTIONS",
    "PREVIOUS_HOSTS_PREDICATE",
    "PREVIOUS_PRIORITIES",
    "ROUTER_FILTER",
    "cluster_name",
    "listener_name",
    "route_config_name",
]

HCM_FILTER: Final = "envoy.filters.network.http_connection_manager"
ROUTER_FILTER: Final = "envoy.filters.http.router"
PREVIOUS_HOSTS_PREDICATE: Final = "envoy.retry_host_predicates.previous_hosts"
PREVIOUS_PRIORITIES: Final = "envoy.retry_priorities.previous_priorities"
HTTP_PROTOCOL_OPTIONS: Final = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
"""The key of ``Cluster.typed_extension_protocol_options`` Envoy looks up for HTTP options."""


def listener_name(listener: Listener) -> str:
    return listener.name


def route_config_name(listener: Listener) -> str:
    """One RouteConfiguration per listener, named like it."""
    return listener.name


def cluster_name(service: Service | str) -> str:
    """One Cluster (and one ClusterLoadAssignment) per service, named like it."""
    return service if isinstance(service, str) else service.name
