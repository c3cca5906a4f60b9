"""Route configurations: one per listener, a single catch-all virtual host whose routes
keep the policy's order (Envoy takes the first match, as the policy promises)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2
from envoy.extensions.retry.priority.previous_priorities.v3 import previous_priorities_config_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2

from inferway.policies.model import (
    Backend,
    HeaderMatch,
    Listener,
    PathMatch,
    Retries,
    Route,
    Service,
)
from inferway.xds.translate import names
from inferway.xds.translate._protos import duration, pack, uint32_value
from inferway.xds.translate.load_balancing import ORCA_HEADER, build_route_hash_policies
from inferway.xds.translate.rate_limit import add_route_rate_limit
from inferway.xds.translate.rbac import add_route_access

__all__ = [
    "build_header_matcher",
    "build_retry_policy",
    "build_route",
    "build_route_action",
    "build_route_configuration",
    "build_route_match",
    "build_weighted_clusters",
    "per_try_timeout_of",
    "routes_for_listener",
]


def routes_for_listener(routes: Sequence[Route], listener: Listener) -> list[Route]:
    """The routes served on ``listener``, in policy order (no ``listeners`` = every one)."""
    return [r for r in routes if r.listeners is None or listener.name in r.listeners]


def build_route_configuration(
    listener: Listener, routes: Sequence[Route], services: Sequence[Service] = ()
) -> route_pb2.RouteConfiguration:
    """``services`` give the routes their hash policies (ring_hash / maglev affinity)."""
    by_name = {s.name: s for s in services}
    return route_pb2.RouteConfiguration(
        name=names.route_config_name(listener),
        virtual_hosts=[
            rc_pb2.VirtualHost(
                name=listener.name,
                domains=["*"],
                routes=[build_route(r, by_name) for r in routes_for_listener(routes, listener)],
                # backends' ORCA load reports are for Envoy's load balancer, not for clients
                response_headers_to_remove=[ORCA_HEADER],
            )
        ],
    )


def build_route(route: Route, services: Mapping[str, Service] | None = None) -> rc_pb2.Route:
    proto = rc_pb2.Route(
        name=route.name,
        stat_prefix=route.name,  # per-route stats: envoy_vhost_route_* {envoy_route=<name>}
        match=build_route_match(route.match.path, route.match.headers),
        route=build_route_action(route),
    )
    add_route_access(proto, route)
    add_route_rate_limit(proto, route)
    proto.route.hash_policy.extend(build_route_hash_policies(route, services or {}))
    return proto


def build_route_match(path: PathMatch, headers: Sequence[HeaderMatch]) -> rc_pb2.RouteMatch:
    match = rc_pb2.RouteMatch(headers=[build_header_matcher(h) for h in headers])
    if path.prefix is not None:
        match.prefix = path.prefix
    elif path.exact is not None:
        match.path = path.exact
    else:
        assert path.regex is not None  # PathMatch guarantees exactly one
        match.safe_regex.CopyFrom(_regex(path.regex))
    return match


def build_header_matcher(header: HeaderMatch) -> rc_pb2.HeaderMatcher:
    matcher = rc_pb2.HeaderMatcher(name=header.name, invert_match=header.invert)
    if header.present is not None:
        matcher.present_match = header.present
    elif header.exact is not None:
        matcher.string_match.CopyFrom(string_pb2.StringMatcher(exact=header.exact))
    elif header.prefix is not None:
        matcher.string_match.CopyFrom(string_pb2.StringMatcher(prefix=header.prefix))
    else:
        assert header.regex is not None  # HeaderMatch guarantees exactly one
        matcher.string_match.CopyFrom(string_pb2.StringMatcher(safe_regex=_regex(header.regex)))
    return matcher


def build_route_action(route: Route) -> rc_pb2.RouteAction:
    """A single backend is a plain ``cluster``; several become ``weighted_clusters`` with
    weights in permille (99.9 / 0.1 -> 999 / 1), zero allowed (ENVOY_NOTES: weights are
    relative; ``total_weight`` is deprecated and left unset)."""
    action = rc_pb2.RouteAction(timeout=duration(route.timeout))
    if len(route.backends) == 1:
        action.cluster = names.cluster_name(route.backends[0].service)
    else:
        action.weighted_clusters.CopyFrom(build_weighted_clusters(route.backends))
    # No ``retries``: one retry, with its defaults. A hung replica then costs a request one
    # per-try timeout, not the whole route timeout (docs/policy.md, routes[].retries).
    retries = route.retries if route.retries is not None else Retries()
    action.retry_policy.CopyFrom(build_retry_policy(retries, route_timeout=route.timeout))
    if retries.per_try_timeout is None and action.retry_policy.HasField("per_try_timeout"):
        # A default per-try timeout sends a second try without cancelling the first, so a
        # slow but healthy replica still answers: the default never fails a request.
        action.hedge_policy.hedge_on_per_try_timeout = True
    return action


def per_try_timeout_of(retries: Retries, route_timeout: float) -> float | None:
    """``retries.per_try_timeout``, else the route timeout shared by every try (``attempts``
    retries + the first), so each try fits in it; None: no per-try timeout (no retries, or a
    route without a timeout)."""
    if retries.per_try_timeout is not None:
        return retries.per_try_timeout
    if retries.attempts == 0 or route_timeout <= 0:
        return None
    return route_timeout / (retries.attempts + 1)


def build_weighted_clusters(backends: Sequence[Backend]) -> rc_pb2.WeightedCluster:
    return rc_pb2.WeightedCluster(
        clusters=[
            rc_pb2.WeightedCluster.ClusterWeight(
                name=names.cluster_name(b.service), weight=uint32_value(b.permille)
            )
            for b in backends
        ]
    )


def build_retry_policy(retries: Retries, *, route_timeout: float = 0.0) -> rc_pb2.RetryPolicy:
    """``on`` maps one to one onto Envoy's ``retry_on`` tokens. Status codes are retried only
    through ``retriable-status-codes`` + ``retriable_status_codes``: a bare ``503`` in
    ``retry_on`` is silently ignored by Envoy (ENVOY_NOTES), so giving codes turns the
    token on. By default retries avoid hosts that already failed this request
    (previous_hosts), re-picking up to ``host_selection.max_attempts`` times, and after
    ``host_selection.next_priority_after`` tries in one priority tier they move on to the
    next tier (previous_priorities), so a tier that died all at once costs no request."""
    conditions = list(dict.fromkeys(retries.on))
    if retries.retriable_status_codes and "retriable-status-codes" not in conditions:
        conditions.append("retriable-status-codes")
    policy = rc_pb2.RetryPolicy(
        retry_on=",".join(conditions),
        num_retries=uint32_value(retries.attempts),
        retriable_status_codes=sorted(set(retries.retriable_status_codes)),
    )
    if retries.host_selection.avoid_previous:
        policy.retry_host_predicate.append(
            rc_pb2.RetryPolicy.RetryHostPredicate(
                name=names.PREVIOUS_HOSTS_PREDICATE,
                typed_config=pack(previous_hosts_pb2.PreviousHostsPredicate()),
            )
        )
        policy.host_selection_retry_max_attempts = retries.host_selection.max_attempts
    if retries.host_selection.next_priority_after is not None:
        policy.retry_priority.CopyFrom(
            rc_pb2.RetryPolicy.RetryPriority(
                name=names.PREVIOUS_PRIORITIES,
                typed_config=pack(
                    previous_priorities_config_pb2.PreviousPrioritiesConfig(
                        update_frequency=retries.host_selection.next_priority_after
                    )
                ),
            )
        )
    per_try = per_try_timeout_of(retries, route_timeout)
    if per_try is not None:
        policy.per_try_timeout.CopyFrom(duration(per_try))
    return policy


def _regex(pattern: str) -> regex_pb2.RegexMatcher:
    """RE2 is Envoy's default engine, so only the pattern is set."""
    return regex_pb2.RegexMatcher(regex=pattern)
