"""A route in the IR: its match, backends (weight overrides applied), retries, access rules,
rate limit, the hash policies its sticky split and its backends' load balancing need, and
its mirror and fault (route_traffic.py)."""

from __future__ import annotations

from collections.abc import Mapping

from inferway.policies.access import Access, AccessRule
from inferway.policies.model import HeaderMatch, PathMatch, Retries, Route, Service
from inferway.policies.traffic import HashOn, RateLimit
from inferway.resolve.features import resolve_features
from inferway.resolve.ir.access import AccessHeaderIR, AccessIR, AccessRuleIR
from inferway.resolve.ir.route import (
    CookieIR,
    HashPolicyIR,
    HeaderMatchIR,
    PathMatchIR,
    RateLimitIR,
    RetryIR,
    RouteIR,
    RouteMatchIR,
)
from inferway.resolve.llm import llm_default_retries, llm_path, resolve_llm_route
from inferway.resolve.route_traffic import resolve_cookie_match, resolve_fault, resolve_mirror
from inferway.resolve.weights import resolve_backends

__all__ = [
    "per_try_timeout_of",
    "resolve_access",
    "resolve_hash_policies",
    "resolve_path_match",
    "resolve_retries",
    "resolve_route",
]

_HASHING = frozenset({"ring_hash", "maglev"})


def resolve_route(
    route: Route,
    services: Mapping[str, Service],
    weights: Mapping[str, float] | None = None,
    *,
    served_by_headers: bool = True,
    rate_shares: Mapping[str, int] | None = None,
) -> RouteIR:
    """``weights``: this route's override from State (service -> weight), if any;
    ``served_by_headers``: the policy's default, which the route's own setting overrides.
    An ``openai`` route gets its endpoints' paths, no total timeout unless it sets one (a
    stream may last; ``idle_timeout`` bounds silence) and fallback retries (resolve/llm.py)."""
    llm = resolve_llm_route(route)
    timeout = route.timeout
    retries = route.retries if route.retries is not None else Retries()
    if llm is not None:
        timeout = llm.timeout
        retries = route.retries if route.retries is not None else llm_default_retries()
    return RouteIR(
        name=route.name,
        match=RouteMatchIR(
            path=resolve_path_match(route.match.path) if llm is None else llm_path(llm.prefix),
            headers=tuple(_header_match(h) for h in route.match.headers),
            cookies=tuple(resolve_cookie_match(c) for c in route.match.cookies),
            features=resolve_features(route.match.features),
        ),
        backends=resolve_backends(route, weights),
        timeout=timeout,
        # No ``retries``: one retry with the defaults, so a hung replica costs a request one
        # per-try timeout, not the whole route timeout (docs/policy.md, routes[].retries);
        # an openai route gets no default per-try timeout: a stream is never hedged.
        retries=resolve_retries(retries, 0.0 if llm is not None else timeout),
        access=resolve_access(route.access),
        rate_limit=(
            None if route.rate_limit is None else _rate_limit(route.rate_limit, rate_shares)
        ),
        hash_policies=resolve_hash_policies(route, services),
        sticky=route.hash is not None,
        mirror=resolve_mirror(route.mirror),
        fault=resolve_fault(route),
        served_by_headers=(
            served_by_headers if route.served_by_headers is None else route.served_by_headers
        ),
        llm=llm,
    )


def resolve_path_match(path: PathMatch) -> PathMatchIR:
    if path.prefix is not None:
        return PathMatchIR(kind="prefix", value=path.prefix)
    if path.exact is not None:
        return PathMatchIR(kind="exact", value=path.exact)
    assert path.regex is not None  # PathMatch guarantees exactly one
    return PathMatchIR(kind="regex", value=path.regex)


def _header_match(header: HeaderMatch) -> HeaderMatchIR:
    return HeaderMatchIR(
        name=header.name,
        invert=header.invert,
        exact=header.exact,
        prefix=header.prefix,
        regex=header.regex,
        present=header.present,
    )


def resolve_retries(retries: Retries, route_timeout: float = 0.0) -> RetryIR:
    """Status codes are retried only through the ``retriable-status-codes`` token (a bare
    ``503`` in retry_on is silently ignored by Envoy, ENVOY_NOTES), so giving codes adds it.

    Without an explicit ``per_try_timeout`` each try gets an equal share of the route timeout
    (``attempts`` retries plus the first), hedged: the second try does not cancel the first,
    so a slow but healthy replica still answers and the default never fails a request.
    ``hedge`` says it explicitly either way."""
    conditions = list(dict.fromkeys(retries.on))
    if retries.retriable_status_codes and "retriable-status-codes" not in conditions:
        conditions.append("retriable-status-codes")
    selection = retries.host_selection
    per_try = per_try_timeout_of(retries, route_timeout)
    return RetryIR(
        retry_on=tuple(conditions),
        num_retries=retries.attempts,
        retriable_status_codes=tuple(sorted(set(retries.retriable_status_codes))),
        avoid_previous_hosts=selection.avoid_previous,
        host_selection_max_attempts=selection.max_attempts,
        next_priority_after=selection.next_priority_after,
        per_try_timeout=per_try,
        hedge_on_per_try_timeout=per_try is not None
        and (retries.hedge if retries.hedge is not None else retries.per_try_timeout is None),
    )


def per_try_timeout_of(retries: Retries, route_timeout: float) -> float | None:
    """``retries.per_try_timeout``, else the route timeout shared by every try; None: no
    per-try timeout (no retries, or a route without a timeout)."""
    if retries.per_try_timeout is not None:
        return retries.per_try_timeout
    if retries.attempts == 0 or route_timeout <= 0:
        return None
    return route_timeout / (retries.attempts + 1)


def resolve_access(access: Access | None) -> AccessIR | None:
    """None for no rules at all (``access: {}`` lets everything through)."""
    if access is None or not access.restricts:
        return None
    return AccessIR(
        allow=tuple(_rule(r) for r in access.allow), deny=tuple(_rule(r) for r in access.deny)
    )


def _rule(rule: AccessRule) -> AccessRuleIR:
    return AccessRuleIR(
        identities=tuple(rule.identities or ()),
        source_ips=tuple(rule.source_ips or ()),
        headers=tuple(
            AccessHeaderIR(name=h.name, exact=h.exact, prefix=h.prefix, present=bool(h.present))
            for h in rule.headers or ()
        ),
    )


def _rate_limit(limit: RateLimit, shares: Mapping[str, int] | None = None) -> RateLimitIR:
    """A bucket of one refill unless ``burst`` says otherwise; ``requests_per_second``
    refills every second. A fleet-wide limit carries each Envoy's share from State (the
    leader's split, gateway/fleet/fleet_limits.py) and the floor a new Envoy holds."""
    return RateLimitIR(
        bucket_size=limit.bucket_size,
        tokens_per_fill=limit.tokens_per_fill,
        fill_interval=limit.refill_seconds,
        scope=limit.scope,
        shares=tuple(sorted((shares or {}).items())) if limit.scope == "fleet" else (),
        floor=fleet_floor(limit.tokens_per_fill),
    )


def fleet_floor(tokens_per_fill: int) -> int:
    """What an Envoy not yet in a fleet-wide limit's split admits per fill: a tenth of the
    limit, at least one token (it can admit at once; the next split gives it its share)."""
    return max(1, tokens_per_fill // 10)


def resolve_hash_policies(
    route: Route, services: Mapping[str, Service]
) -> tuple[HashPolicyIR, ...]:
    """The route's sticky ``hash`` first, then one per distinct ``hash_on`` of the route's
    ring_hash / maglev backends, in backend order: Envoy hashes on the route; the hash picks
    the weighted backend (sticky) and the cluster's ring or table picks the host."""
    seen: list[HashOn] = [] if route.hash is None else [route.hash]
    for backend in route.backends:
        service = services.get(backend.service)
        if service is None or service.load_balancing is None:
            continue
        lb = service.load_balancing
        if lb.policy in _HASHING and lb.hash_on is not None and lb.hash_on not in seen:
            seen.append(lb.hash_on)
    return tuple(_hash_policy(h) for h in seen)


def _hash_policy(hash_on: HashOn) -> HashPolicyIR:
    if hash_on.header is not None:
        return HashPolicyIR(header=hash_on.header)
    if hash_on.cookie is not None:
        cookie = hash_on.cookie
        return HashPolicyIR(cookie=CookieIR(name=cookie.name, ttl=cookie.ttl, path=cookie.path))
    return HashPolicyIR(source_ip=True)
