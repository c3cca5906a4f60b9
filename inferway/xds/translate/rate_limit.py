"""Local rate limiting per route: a token bucket in Envoy itself, no rate-limit service.

The HTTP filter sits in the listener's chain (before the router) with no bucket of its
own, so it limits nothing there; each rate-limited route enables it with its own bucket in
``typed_per_filter_config``. Refused requests get 429 with a JSON body naming the route
(a local-reply mapper: upstream 429s are not local replies and pass through untouched),
and the ``x-ratelimit-*`` headers say the limit and when it refills."""

from __future__ import annotations

from collections.abc import Sequence

from inferway._xds_protos.envoy.config.accesslog.v3 import accesslog_pb2
from inferway._xds_protos.envoy.config.core.v3 import base_pb2, substitution_format_string_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from inferway._xds_protos.envoy.extensions.filters.http.local_ratelimit.v3 import (
    local_rate_limit_pb2 as lrl_pb2,
)
from inferway._xds_protos.envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from inferway._xds_protos.envoy.type.v3 import percent_pb2, token_bucket_pb2
from inferway.resolve.ir.route import RateLimitIR, RouteIR
from inferway.xds.translate import names
from inferway.xds.translate._protos import duration, pack, uint32_value

__all__ = [
    "LOCAL_RATE_LIMIT_FILTER",
    "RATE_LIMITED_BODY",
    "RATE_LIMITED_HEADER",
    "add_route_rate_limit",
    "apply_rate_limit",
    "build_local_rate_limit",
    "build_rate_limited_mapper",
]

LOCAL_RATE_LIMIT_FILTER = "envoy.filters.http.local_ratelimit"
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
    manager.local_reply_config.mappers.append(build_rate_limited_mapper())


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
    return lrl_pb2.LocalRateLimit(
        stat_prefix=route_name,
        token_bucket=token_bucket_pb2.TokenBucket(
            max_tokens=limit.bucket_size,
            tokens_per_fill=uint32_value(limit.tokens_per_fill),
            fill_interval=duration(limit.fill_interval),
        ),
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
