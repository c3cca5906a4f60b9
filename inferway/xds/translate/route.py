"""Route configurations: one per listener, a single catch-all virtual host whose routes
keep the policy's order (Envoy takes the first match, as the policy promises)."""

from __future__ import annotations

from collections.abc import Sequence

from inferway._xds_protos.envoy.config.route.v3 import route_components_pb2 as rc_pb2
from inferway._xds_protos.envoy.config.route.v3 import route_pb2
from inferway._xds_protos.envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from inferway._xds_protos.envoy.extensions.retry.priority.previous_priorities.v3 import (
    previous_priorities_config_pb2,
)
from inferway._xds_protos.envoy.type.matcher.v3 import regex_pb2, string_pb2
from inferway.resolve.ir.listener import ListenerIR
from inferway.resolve.ir.route import BackendIR, HeaderMatchIR, PathMatchIR, RetryIR, RouteIR
from inferway.resolve.ir.route_traffic import CookieMatchIR
from inferway.resolve.llm import LLM_ENDPOINTS
from inferway.xds.translate import names
from inferway.xds.translate._protos import bool_value, duration, pack, uint32_value
from inferway.xds.translate.cookie_match import build_cookie_matcher
from inferway.xds.translate.fault import add_route_fault
from inferway.xds.translate.features import (
    build_feature_matchers,
    build_malformed_route,
    disable_feature_router,
    may_share_requests,
)
from inferway.xds.translate.listener_limits import build_too_large_route
from inferway.xds.translate.llm import (
    UNKNOWN_MODEL_ROUTE,
    add_llm_route,
    build_models_route,
    build_unknown_model_route,
    disable_llm_filter,
)
from inferway.xds.translate.llm_stream import disable_stream_filter
from inferway.xds.translate.load_balancing import ORCA_HEADER, build_hash_policy
from inferway.xds.translate.mirror import add_route_mirror
from inferway.xds.translate.rate_limit import add_route_rate_limit
from inferway.xds.translate.rbac import add_route_access
from inferway.xds.translate.served_by import SERVED_BY_HEADERS, add_served_by_headers

__all__ = [
    "build_header_matcher",
    "build_retry_policy",
    "build_route",
    "build_route_action",
    "build_route_configuration",
    "build_route_match",
    "build_weighted_clusters",
]


def build_route_configuration(listener: ListenerIR) -> route_pb2.RouteConfiguration:
    """The listener's routes, in the IR's (policy) order; a feature route with
    ``on_malformed: reject`` is preceded by its reject twin (features.py)."""
    return route_pb2.RouteConfiguration(
        name=listener.name,
        virtual_hosts=[
            rc_pb2.VirtualHost(
                name=listener.name,
                domains=["*"],
                routes=_listener_routes(listener),
                # served-by headers are Envoy's to set: a client's never reach the upstream
                request_headers_to_remove=list(SERVED_BY_HEADERS),
                # backends' ORCA load reports are for Envoy's load balancer, not for clients
                response_headers_to_remove=[ORCA_HEADER],
            )
        ],
    )


def _listener_routes(listener: ListenerIR) -> list[rc_pb2.Route]:
    featured = [r.match.path for r in listener.routes if r.match.features is not None]
    too_large = build_too_large_route(listener)
    if featured:  # answered on the headers alone: the feature router must not wait for a body
        disable_feature_router(too_large)
    routes: list[rc_pb2.Route] = [too_large]
    for route in listener.routes:
        proto = build_route(route)
        features = route.match.features
        if features is not None and features.on_malformed == "reject":
            routes.append(build_malformed_route(route, proto.match))
        if featured and not any(may_share_requests(route.match.path, p) for p in featured):
            disable_feature_router(proto)
        before, after = _llm_before(listener.routes, route), _llm_after(listener.routes, route)
        if featured and route.llm is not None and not _llm_shares(route.llm.prefix, featured):
            for answer in (proto, *before, *after):  # the regex path would look shared
                disable_feature_router(answer)
        routes.extend([*before, proto, *after])
    served = {r.name for r in listener.routes if r.llm is not None}
    if served:  # the LLM processor sees the openai routes' requests only
        served.update(p.name for p in routes if p.name.startswith(UNKNOWN_MODEL_ROUTE))
        for proto in routes:
            if proto.name not in served:
                disable_llm_filter(proto)
                disable_stream_filter(proto)
    return routes


def _llm_shares(prefix: str, featured: Sequence[PathMatchIR]) -> bool:
    """Whether a feature route's path could take one of the prefix's OpenAI endpoints."""
    paths = [f"{prefix}/{endpoint}" for endpoint in (*LLM_ENDPOINTS, "models")]
    return any(may_share_requests(PathMatchIR("exact", p), f) for p in paths for f in featured)


def _llm_before(routes: Sequence[RouteIR], route: RouteIR) -> list[rc_pb2.Route]:
    """``<prefix>/models`` before the prefix's first openai route."""
    if route.llm is None:
        return []
    same = [r for r in routes if r.llm is not None and r.llm.prefix == route.llm.prefix]
    return [build_models_route(route.llm.prefix, same)] if same[0] is route else []


def _llm_after(routes: Sequence[RouteIR], route: RouteIR) -> list[rc_pb2.Route]:
    """The unknown-model answer after the prefix's last openai route."""
    if route.llm is None:
        return []
    same = [r for r in routes if r.llm is not None and r.llm.prefix == route.llm.prefix]
    return [build_unknown_model_route(route.llm.prefix)] if same[-1] is route else []


def build_route(route: RouteIR) -> rc_pb2.Route:
    proto = rc_pb2.Route(
        name=route.name,
        stat_prefix=route.name,  # per-route stats: envoy_vhost_route_* {envoy_route=<name>}
        match=build_route_match(route.match.path, route.match.headers, route.match.cookies),
        route=build_route_action(route),
    )
    add_route_access(proto, route)
    add_route_rate_limit(proto, route)
    add_route_fault(proto, route)
    add_served_by_headers(proto, route)
    if route.match.features is not None:
        proto.match.dynamic_metadata.extend(build_feature_matchers(route.match.features))
    if route.llm is not None:
        add_llm_route(proto, route)
    proto.route.hash_policy.extend(build_hash_policy(h) for h in route.hash_policies)
    return proto


def build_route_match(
    path: PathMatchIR, headers: Sequence[HeaderMatchIR], cookies: Sequence[CookieMatchIR] = ()
) -> rc_pb2.RouteMatch:
    match = rc_pb2.RouteMatch(
        headers=[build_header_matcher(h) for h in headers]
        + [build_cookie_matcher(c) for c in cookies]
    )
    if path.kind == "prefix":
        match.prefix = path.value
    elif path.kind == "exact":
        match.path = path.value
    else:
        match.safe_regex.CopyFrom(_regex(path.value))
    return match


def build_header_matcher(header: HeaderMatchIR) -> rc_pb2.HeaderMatcher:
    matcher = rc_pb2.HeaderMatcher(name=header.name, invert_match=header.invert)
    if header.present is not None:
        matcher.present_match = header.present
    elif header.exact is not None:
        matcher.string_match.CopyFrom(string_pb2.StringMatcher(exact=header.exact))
    elif header.prefix is not None:
        matcher.string_match.CopyFrom(string_pb2.StringMatcher(prefix=header.prefix))
    else:
        assert header.regex is not None  # HeaderMatchIR holds exactly one
        matcher.string_match.CopyFrom(string_pb2.StringMatcher(safe_regex=_regex(header.regex)))
    return matcher


def build_route_action(route: RouteIR) -> rc_pb2.RouteAction:
    """A single backend is a plain ``cluster``; several become ``weighted_clusters`` with
    weights in parts of 10,000 (99.9 / 0.1 -> 9990 / 10), zero allowed (ENVOY_NOTES: weights
    are relative; ``total_weight`` is deprecated and left unset). A sticky route picks the
    weighted cluster by its hash policies (``use_hash_policy``) instead of at random."""
    action = rc_pb2.RouteAction(timeout=duration(route.timeout))
    if len(route.backends) == 1:
        action.cluster = route.backends[0].service
    else:
        action.weighted_clusters.CopyFrom(build_weighted_clusters(route.backends))
        if route.sticky:
            action.weighted_clusters.use_hash_policy.CopyFrom(bool_value(True))
    add_route_mirror(action, route)
    if route.retries is not None:
        action.retry_policy.CopyFrom(build_retry_policy(route.retries))
        if route.retries.hedge_on_per_try_timeout:
            action.hedge_policy.hedge_on_per_try_timeout = True
    return action


def build_weighted_clusters(backends: Sequence[BackendIR]) -> rc_pb2.WeightedCluster:
    return rc_pb2.WeightedCluster(
        clusters=[
            rc_pb2.WeightedCluster.ClusterWeight(name=b.service, weight=uint32_value(b.weight))
            for b in backends
        ]
    )


def build_retry_policy(retries: RetryIR) -> rc_pb2.RetryPolicy:
    """Retries avoid hosts that already failed this request (previous_hosts) when the IR
    says so, re-picking up to ``host_selection_max_attempts`` times, and after
    ``next_priority_after`` tries in one priority tier they move on to the next tier
    (previous_priorities), so a tier that died all at once costs no request."""
    policy = rc_pb2.RetryPolicy(
        retry_on=",".join(retries.retry_on),
        num_retries=uint32_value(retries.num_retries),
        retriable_status_codes=retries.retriable_status_codes,
    )
    if retries.avoid_previous_hosts:
        policy.retry_host_predicate.append(
            rc_pb2.RetryPolicy.RetryHostPredicate(
                name=names.PREVIOUS_HOSTS_PREDICATE,
                typed_config=pack(previous_hosts_pb2.PreviousHostsPredicate()),
            )
        )
        policy.host_selection_retry_max_attempts = retries.host_selection_max_attempts
    if retries.next_priority_after is not None:
        policy.retry_priority.CopyFrom(
            rc_pb2.RetryPolicy.RetryPriority(
                name=names.PREVIOUS_PRIORITIES,
                typed_config=pack(
                    previous_priorities_config_pb2.PreviousPrioritiesConfig(
                        update_frequency=retries.next_priority_after
                    )
                ),
            )
        )
    if retries.per_try_timeout is not None:
        policy.per_try_timeout.CopyFrom(duration(retries.per_try_timeout))
    return policy


def _regex(pattern: str) -> regex_pb2.RegexMatcher:
    """RE2 is Envoy's default engine, so only the pattern is set."""
    return regex_pb2.RegexMatcher(regex=pattern)
