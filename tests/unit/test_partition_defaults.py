"""Silent-partition defaults (docs/fleet.md "Zones and partitions"): a short connect timeout,
TCP keepalive on upstream connections, the retry sent to another tier after one try, and a
hedge that a policy can ask for with its own per-try timeout."""

from __future__ import annotations

from typing import Any

from inferway._xds_protos.envoy.config.cluster.v3 import cluster_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway._xds_protos.envoy.extensions.retry.priority.previous_priorities.v3 import (
    previous_priorities_config_pb2,
)
from inferway.policies.model import Policy
from inferway.resolve import resolve_policy
from inferway.xds import type_urls
from inferway.xds.translate import translate


def _translated(service: dict[str, Any], retries: dict[str, Any] | None = None):
    route: dict[str, Any] = {"name": "all", "backends": [{"service": "model"}]}
    if retries is not None:
        route["retries"] = retries
    policy = Policy.model_validate(
        {
            "listeners": [{"name": "main", "port": 10000}],
            "services": [{"name": "model", "endpoints": ["10.0.0.1:8000"], **service}],
            "routes": [route],
        }
    )
    resources = translate(resolve_policy(policy))
    cluster = resources.of_type(type_urls.CLUSTER)["model"]
    routes = resources.of_type(type_urls.ROUTE)["main"]
    assert isinstance(cluster, cluster_pb2.Cluster)
    assert isinstance(routes, route_pb2.RouteConfiguration)
    return cluster, next(r for r in routes.virtual_hosts[0].routes if r.name == "all").route


def test_defaults_close_silent_connections_and_retry_in_another_tier() -> None:
    cluster, action = _translated({})
    assert cluster.connect_timeout.ToMilliseconds() == 500
    keepalive = cluster.upstream_connection_options.tcp_keepalive
    assert (keepalive.keepalive_time.value, keepalive.keepalive_interval.value) == (5, 1)
    assert keepalive.keepalive_probes.value == 3
    priority = previous_priorities_config_pb2.PreviousPrioritiesConfig()
    action.retry_policy.retry_priority.typed_config.Unpack(priority)
    assert priority.update_frequency == 1
    assert action.hedge_policy.hedge_on_per_try_timeout  # the default per-try timeout
    assert action.retry_policy.per_try_timeout.ToMilliseconds() == 7500


def test_keepalive_can_be_tuned_or_turned_off_and_rounds_up_to_seconds() -> None:
    cluster, _ = _translated({"tcp_keepalive": {"idle": "1500ms", "interval": "2s"}})
    keepalive = cluster.upstream_connection_options.tcp_keepalive
    assert (keepalive.keepalive_time.value, keepalive.keepalive_interval.value) == (2, 2)
    cluster, _ = _translated({"tcp_keepalive": {"enabled": False}})
    assert not cluster.HasField("upstream_connection_options")


def test_an_explicit_per_try_timeout_is_hedged_only_when_asked() -> None:
    _, plain = _translated({}, {"per_try_timeout": "100ms"})
    assert plain.retry_policy.per_try_timeout.ToMilliseconds() == 100
    assert not plain.hedge_policy.hedge_on_per_try_timeout
    _, hedged = _translated({}, {"per_try_timeout": "100ms", "hedge": True})
    assert hedged.hedge_policy.hedge_on_per_try_timeout
    _, unhedged = _translated({}, {"hedge": False})
    assert not unhedged.hedge_policy.hedge_on_per_try_timeout
