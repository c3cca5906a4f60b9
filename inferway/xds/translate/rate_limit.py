"""Local rate limiting per route: a token bucket in Envoy itself, no rate-limit service.

The HTTP filter sits in the listener's chain (before the router) with no bucket of its
own, so it limits nothing there; each rate-limited route enables it with its own bucket in
``typed_per_filter_config``. Refused requests get 429 with a JSON body naming the route
(a local-reply mapper: upstream 429s are not local replies and pass through untouched),
and the ``x-ratelimit-*`` headers say the limit and when it refills.

A fleet-wide limit (``scope: fleet``) is the same filter with one bucket per Envoy: every
Envoy gets the same route configuration, listing each node's share as a descriptor bucket keyed
by node id, and a ``header_mutation`` filter ahead of the limiter writes the Envoy's own node id
(``%CEL(xds.node.id)%``, overwriting whatever a client sent) into ``x-inferway-node``, which the
limiter's ``request_headers`` action turns into the descriptor. So each Envoy consumes only its
own bucket (``always_consume_default_token_bucket: false``); a node not listed yet consumes the
default bucket, the floor. Every Envoy holds its share locally: no call per request."""

from __future__ import annotations

from collections.abc import Sequence

from inferway._xds_protos.envoy.config.accesslog.v3 import accesslog_pb2
from inferway._xds_protos.envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from inferway._xds_protos.envoy.config.core.v3 import base_pb2, substitution_format_string_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from inferway._xds_protos.envoy.extensions.filters.http.header_mutation.v3 import (
    header_mutation_pb2 as hm_pb2,
)
from inferway._xds_protos.envoy.extensions.filters.http.local_ratelimit.v3 import (
    local_rate_limit_pb2 as lrl_pb2,
)
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.type.v3 import percent_pb2, token_bucket_pb2
from inferway.resolve.ir.route import RateLimitIR, RouteIR
from inferway.xds.translate import names
from inferway.xds.translate._protos import bool_value, duration, pack, uint32_value

__all__ = [
    "FLEET_NODE_FILTER",
    "FLEET_NODE_HEADER",
    "LOCAL_RATE_LIMIT_FILTER",
    "RATE_LIMITED_BODY",
    "RATE_LIMITED_HEADER",
    "add_route_rate_limit",
    "apply_rate_limit",
    "build_local_rate_limit",
    "build_rate_limited_mapper",
]

LOCAL_RATE_LIMIT_FILTER = "envoy.filters.http.local_ratelimit"
FLEET_NODE_FILTER = "inferway.fleet_node"
"""A header_mutation filter (found by its config type, so the name is free): the node header."""
FLEET_NODE_HEADER = "x-inferway-node"
"""Set by the listener to the Envoy's own node id: the descriptor of a fleet-wide limit."""
_NODE_DESCRIPTOR = "inferway_node"
RATE_LIMITED_HEADER = "x-inferway-rate-limited"
RATE_LIMITED_BODY = (
    '{"error":"rate limited: route %ROUTE_NAME% is over its request rate, retry later"}\n'
)
"""``%ROUTE_NAME%`` is Envoy's command operator for the matched route's name."""

_TOO_MANY_REQUESTS = 429
_STATUS_RUNTIME_KEY = "inferway.rate_limited.status"


def apply_rate_limit(manager: hcm_pb2.HttpConnectionManager, routes: Sequence[RouteIR]) -> None:
    """Insert the filter just before the router and the 429 body mapper, when any of
    ``routes`` (those served on the manager's listener) has a rate limit."""
    if not any(r.rate_limit is not None for r in routes):
        return
    position = next(
        (i for i, f in enumerate(manager.http_filters) if f.name == names.ROUTER_FILTER),
        len(manager.http_filters),
    )
    manager.http_filters.insert(
        position,
        hcm_pb2.HttpFilter(
            name=LOCAL_RATE_LIMIT_FILTER,
            typed_config=pack(lrl_pb2.LocalRateLimit(stat_prefix="local_rate_limit")),
        ),
    )
    if any(r.rate_limit is not None and r.rate_limit.scope == "fleet" for r in routes):
        manager.http_filters.insert(position, _node_header_filter())
    manager.local_reply_config.mappers.append(build_rate_limited_mapper())


def _node_header_filter() -> hcm_pb2.HttpFilter:
    """Writes this Envoy's node id into ``x-inferway-node`` (a client's value is replaced)."""
    node = base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=FLEET_NODE_HEADER, value="%CEL(xds.node.id)%"),
        append_action=base_pb2.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
    )
    mutation = hm_pb2.HeaderMutation(
        mutations=hm_pb2.Mutations(
            request_mutations=[mutation_rules_pb2.HeaderMutation(append=node)]
        )
    )
    return hcm_pb2.HttpFilter(name=FLEET_NODE_FILTER, typed_config=pack(mutation))


def add_route_rate_limit(route_proto: rc_pb2.Route, route: RouteIR) -> None:
    """Attach the route's bucket (nothing when the route has no rate limit)."""
    if route.rate_limit is not None:
        route_proto.typed_per_filter_config[LOCAL_RATE_LIMIT_FILTER].CopyFrom(
            pack(build_local_rate_limit(route.name, route.rate_limit))
        )


def build_local_rate_limit(route_name: str, limit: RateLimitIR) -> lrl_pb2.LocalRateLimit:
    everyone = base_pb2.RuntimeFractionalPercent(
        default_value=percent_pb2.FractionalPercent(
            numerator=100, denominator=percent_pb2.FractionalPercent.DenominatorType.HUNDRED
        ),
        runtime_key=f"inferway.rate_limit.{route_name}",
    )
    config = lrl_pb2.LocalRateLimit(
        stat_prefix=route_name,
        token_bucket=_bucket(limit, limit.tokens_per_fill),
        filter_enabled=everyone,
        filter_enforced=everyone,
        response_headers_to_add=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=RATE_LIMITED_HEADER, value="true"),
                append_action=base_pb2.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        ],
        enable_x_ratelimit_headers=ratelimit_pb2.XRateLimitHeadersRFCVersion.DRAFT_VERSION_03,
    )
    if limit.scope == "fleet":
        _split(config, limit)
    return config


def _bucket(limit: RateLimitIR, tokens: int) -> token_bucket_pb2.TokenBucket:
    """``tokens`` per fill, and the burst in the same proportion of the limit's (at least
    one fill)."""
    burst = max(tokens, -(-limit.bucket_size * tokens // max(limit.tokens_per_fill, 1)))
    return token_bucket_pb2.TokenBucket(
        max_tokens=burst,
        tokens_per_fill=uint32_value(tokens),
        fill_interval=duration(limit.fill_interval),
    )


def _split(config: lrl_pb2.LocalRateLimit, limit: RateLimitIR) -> None:
    """The fleet's bucket as one bucket per node: the default bucket is the floor."""
    config.token_bucket.CopyFrom(_bucket(limit, limit.floor))
    config.always_consume_default_token_bucket.CopyFrom(bool_value(False))
    action = rc_pb2.RateLimit.Action(
        request_headers=rc_pb2.RateLimit.Action.RequestHeaders(
            header_name=FLEET_NODE_HEADER, descriptor_key=_NODE_DESCRIPTOR
        )
    )
    config.rate_limits.append(rc_pb2.RateLimit(actions=[action]))
    for node, tokens in limit.shares:
        config.descriptors.append(
            ratelimit_pb2.LocalRateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=_NODE_DESCRIPTOR, value=node)],
                token_bucket=_bucket(limit, max(tokens, 1)),
            )
        )


def build_rate_limited_mapper() -> hcm_pb2.ResponseMapper:
    """Local replies with status 429 get a JSON body naming the route."""
    status = accesslog_pb2.StatusCodeFilter(
        comparison=accesslog_pb2.ComparisonFilter(
            op=accesslog_pb2.ComparisonFilter.Op.EQ,
            value=base_pb2.RuntimeUInt32(
                default_value=_TOO_MANY_REQUESTS, runtime_key=_STATUS_RUNTIME_KEY
            ),
        )
    )
    return hcm_pb2.ResponseMapper(
        filter=accesslog_pb2.AccessLogFilter(status_code_filter=status),
        body_format_override=substitution_format_string_pb2.SubstitutionFormatString(
            text_format_source=base_pb2.DataSource(inline_string=RATE_LIMITED_BODY),
            content_type="application/json",
        ),
    )
