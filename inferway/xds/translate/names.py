"""Envoy extension names of the translator, in one place.

The contract (see CONTRACTS.md) is that every Envoy name equals the policy name it comes
from (listener, route configuration, cluster and load assignment are named like the policy
entry), so a person reading Envoy stats or admin output finds the policy entry directly.
"""

from typing import Final

__all__ = [
    "HCM_FILTER",
    "HTTP_PROTOCOL_OPTIONS",
    "PREVIOUS_HOSTS_PREDICATE",
    "PREVIOUS_PRIORITIES",
    "ROUTER_FILTER",
]

HCM_FILTER: Final = "envoy.filters.network.http_connection_manager"
ROUTER_FILTER: Final = "envoy.filters.http.router"
PREVIOUS_HOSTS_PREDICATE: Final = "envoy.retry_host_predicates.previous_hosts"
PREVIOUS_PRIORITIES: Final = "envoy.retry_priorities.previous_priorities"
HTTP_PROTOCOL_OPTIONS: Final = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
"""The key of ``Cluster.typed_extension_protocol_options`` Envoy looks up for HTTP options."""
