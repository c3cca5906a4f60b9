"""The Envoy metric names inferway's dashboard and alerts rely on, in one place.

Envoy's Prometheus names are not ours to choose: they are what Envoy 1.40's
``/stats/prometheus`` emits for the stats inferway configures (cluster = service = canary
version, route ``stat_prefix`` = route name, HTTP connection manager ``stat_prefix`` =
listener name). The integration test scrapes a real Envoy and checks every name here, and the
deploy-assets test checks that the dashboard and alert rules use no other Envoy name.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ENVOY_METRICS"]

ENVOY_METRICS: Final = frozenset(
    {
        # per service (= canary version): envoy_cluster_name label
        "envoy_cluster_upstream_rq_total",
        "envoy_cluster_upstream_rq_xx",
        "envoy_cluster_upstream_rq_time_bucket",
        "envoy_cluster_upstream_rq_time_count",
        "envoy_cluster_upstream_rq_time_sum",
        "envoy_cluster_membership_healthy",
        "envoy_cluster_membership_total",
        # per route: envoy_virtual_host (= listener) and envoy_route labels
        "envoy_vhost_route_upstream_rq_total",
        "envoy_vhost_route_upstream_rq_xx",
        "envoy_vhost_route_upstream_rq_time_bucket",
        "envoy_vhost_route_upstream_rq_time_count",
        "envoy_vhost_route_upstream_rq_time_sum",
        # per listener: envoy_http_conn_manager_prefix label
        "envoy_http_downstream_rq_total",
        "envoy_http_downstream_rq_xx",
        # the data plane's view of its control plane
        "envoy_control_plane_connected_state",
        "envoy_cluster_manager_cds_update_rejected",
        "envoy_listener_manager_lds_update_rejected",
        "envoy_http_rds_update_rejected",
    }
)
