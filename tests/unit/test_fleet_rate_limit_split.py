"""Fleet-wide rate limits, pure parts: the split of a limit by offered load (whole tokens that
add up to the limit, max-min fair), the policy's ``scope``, and the translation (one route
configuration for every Envoy, one bucket per node keyed by the node header)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from rich.console import Console

from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway._xds_protos.envoy.extensions.filters.http.local_ratelimit.v3 import (
    local_rate_limit_pb2,
)
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway.cli.status import render_status
from inferway.gateway.admin_documents import StatusDocument
from inferway.gateway.fleet.fleet_limits import local_limit_warnings
from inferway.gateway.fleet.limit_shares import split_limit
from inferway.policies import Policy
from inferway.policies.traffic import RateLimit
from inferway.resolve import resolve_policy
from inferway.state import State
from inferway.xds import type_urls
from inferway.xds.translate import translate
from inferway.xds.translate.rate_limit import (
    FLEET_NODE_FILTER,
    FLEET_NODE_HEADER,
    LOCAL_RATE_LIMIT_FILTER,
)


def test_uneven_load_is_split_max_min_fair_in_whole_tokens() -> None:
    # 30, 12 and 4 offered for 20: the light one keeps its load and headroom, the heavy ones
    # split what it uses (16), so the fleet admits the limit
    assert split_limit(20, {"a": 30, "b": 12, "c": 4}, floor=2) == {"a": 8, "b": 8, "c": 5}
    # the demands fit: the spare is shared in proportion (nothing of the limit unused)
    assert split_limit(20, {"a": 4, "b": 4}, floor=2) == {"a": 10, "b": 10}
    # not measured yet: a newcomer asks the floor
    assert split_limit(20, {"a": 40, "b": None}, floor=2) == {"a": 18, "b": 2}
    assert split_limit(2, {"a": 1, "b": 5, "c": 9}, floor=1) == {"a": 0, "b": 1, "c": 1}
    assert split_limit(20, {}, floor=2) == {}


@given(
    limit=st.integers(1, 5000),
    offered=st.dictionaries(
        st.text("abcdef", min_size=1, max_size=3),
        st.none() | st.floats(0, 10_000, allow_nan=False),
        min_size=1,
        max_size=12,
    ),
)
def test_a_split_admits_the_limit_and_gives_each_envoy_what_it_asks_if_it_can(
    limit: int, offered: dict[str, float | None]
) -> None:
    floor = max(1, limit // 10)
    shares = split_limit(limit, offered, floor=floor)
    assert set(shares) == set(offered)
    if limit < len(offered):
        assert sum(shares.values()) == limit
        return
    assert min(shares.values()) >= 1
    asked = {n: max((load or 0) * 1.25, floor, 1) for n, load in offered.items()}
    use = {n: load if load is not None else floor for n, load in offered.items()}
    # what the fleet admits while each Envoy offers its load: the limit (or all, if less),
    # give or take a token of rounding per Envoy and the floors of nearly idle Envoys
    admitted = sum(min(shares[n], use[n]) for n in offered)
    idle = sum(floor for n in offered if use[n] < floor)
    assert admitted <= limit + len(offered)
    assert admitted >= min(limit, sum(use.values())) - len(offered) - 1 - idle
    fair = limit / len(offered)
    for node in offered:  # an Envoy asking less than an equal part gets it
        if asked[node] <= fair:
            assert shares[node] >= int(asked[node]), (node, shares)


def _policy(scope: str | None) -> Policy:
    limit: dict[str, Any] = {"requests_per_second": 20}
    if scope is not None:
        limit["scope"] = scope
    return Policy.model_validate(
        {
            "listeners": [{"name": "main", "port": 10000}],
            "services": [{"name": "m", "endpoints": []}],
            "routes": [{"name": "chat", "backends": [{"service": "m"}], "rate_limit": limit}],
        }
    )


def test_scope_is_envoy_unless_it_says_fleet() -> None:
    assert _policy(None).routes[0].rate_limit.scope == "envoy"  # type: ignore[union-attr]
    assert _policy("fleet").routes[0].rate_limit.scope == "fleet"  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="scope"):
        RateLimit.model_validate({"requests_per_second": 5, "scope": "zone"})


def _limiter(state: State, scope: str) -> tuple[hcm_pb2.HttpConnectionManager, Any]:
    resources = translate(resolve_policy(_policy(scope), state))
    listener = resources.of_type(type_urls.LISTENER)["main"]
    manager = hcm_pb2.HttpConnectionManager()
    listener.filter_chains[0].filters[0].typed_config.Unpack(manager)
    (routes,) = resources.of_type(type_urls.ROUTE).values()
    assert isinstance(routes, route_pb2.RouteConfiguration)
    config = local_rate_limit_pb2.LocalRateLimit()
    (route,) = (r for r in routes.virtual_hosts[0].routes if r.name == "chat")
    assert route.typed_per_filter_config[LOCAL_RATE_LIMIT_FILTER].Unpack(config)
    return manager, config


def test_a_fleet_limit_is_one_bucket_per_node_keyed_by_the_node_header() -> None:
    state = State(rate_shares={"chat": {"envoy-a": 12, "envoy-b": 8}})
    manager, config = _limiter(state, "fleet")
    filters = [f.name for f in manager.http_filters]
    assert filters.index(FLEET_NODE_FILTER) == filters.index(LOCAL_RATE_LIMIT_FILTER) - 1
    buckets = {
        d.entries[0].value: (d.token_bucket.tokens_per_fill.value, d.token_bucket.max_tokens)
        for d in config.descriptors
    }
    assert buckets == {"envoy-a": (12, 12), "envoy-b": (8, 8)}
    assert config.token_bucket.tokens_per_fill.value == 2  # the floor of a node not listed
    assert not config.always_consume_default_token_bucket.value
    (action,) = config.rate_limits[0].actions
    assert action.request_headers.header_name == FLEET_NODE_HEADER
    # a per-Envoy limit is as before: one bucket, no node header
    manager, config = _limiter(state, "envoy")
    assert FLEET_NODE_FILTER not in [f.name for f in manager.http_filters]
    assert not config.descriptors and config.token_bucket.tokens_per_fill.value == 20


def test_a_per_envoy_limit_served_by_several_envoys_is_a_warning() -> None:
    assert local_limit_warnings(_policy("envoy"), 1) == []
    (warning,) = local_limit_warnings(_policy("envoy"), 3)
    assert "route chat" in warning and "up to 3 x 20" in warning
    assert local_limit_warnings(_policy("fleet"), 3) == []


def test_status_shows_the_warnings() -> None:
    console = Console(width=200, record=True)
    (warning,) = local_limit_warnings(_policy("envoy"), 2)
    render_status(
        cast(StatusDocument, {"policy": None, "nodes": [], "warnings": [warning]}), console
    )
    assert (
        "route chat: rate_limit holds per Envoy (scope: envoy) and 2 Envoys"
        in console.export_text()
    )
