"""IR of a route: match, weighted backends (overrides applied), retries, limits, affinity,
and the traffic tools (mirror, fault) of route_traffic.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inferway.resolve.ir.access import AccessIR
from inferway.resolve.ir.features import FeaturesIR
from inferway.resolve.ir.llm import LlmRouteIR
from inferway.resolve.ir.route_traffic import CookieMatchIR, FaultIR, MirrorIR

__all__ = [
    "WEIGHT_TOTAL",
    "BackendIR",
    "CookieIR",
    "HashPolicyIR",
    "HeaderMatchIR",
    "PathMatchIR",
    "RateLimitIR",
    "RetryIR",
    "RouteIR",
    "RouteMatchIR",
]

WEIGHT_TOTAL = 10_000
"""A route's backend weights always add up to this, whatever the policy's numbers add up to:
a sticky split (``use_hash_policy``) maps a hash onto the weights in order, so a constant
total is what lets a growing canary keep every user it already had (ENVOY_NOTES)."""


@dataclass(frozen=True)
class PathMatchIR:
    kind: Literal["prefix", "exact", "regex"]
    value: str


@dataclass(frozen=True)
class HeaderMatchIR:
    """Exactly one of exact, prefix, regex or present is set (as in the policy)."""

    name: str
    invert: bool
    exact: str | None = None
    prefix: str | None = None
    regex: str | None = None
    present: bool | None = None


@dataclass(frozen=True)
class RouteMatchIR:
    path: PathMatchIR
    headers: tuple[HeaderMatchIR, ...]
    cookies: tuple[CookieMatchIR, ...] = ()
    features: FeaturesIR | None = None
    """Body features the feature router measured (None: the route does not look)."""


@dataclass(frozen=True)
class BackendIR:
    service: str
    weight: int
    """Parts of WEIGHT_TOTAL: the policy's relative weight (or its override), normalized so
    the route's backends add up to exactly WEIGHT_TOTAL."""


@dataclass(frozen=True)
class RetryIR:
    retry_on: tuple[str, ...]
    """Envoy retry_on tokens, deduplicated, ``retriable-status-codes`` added when codes are."""
    num_retries: int
    retriable_status_codes: tuple[int, ...]
    avoid_previous_hosts: bool
    host_selection_max_attempts: int
    next_priority_after: int | None
    """None: retries stay on the normal priority load."""
    per_try_timeout: float | None
    """None: each try may take the whole route timeout."""
    hedge_on_per_try_timeout: bool = False
    """True for the default per-try timeout: a timed-out try is not cancelled."""


@dataclass(frozen=True)
class CookieIR:
    name: str
    ttl: float | None
    path: str | None


@dataclass(frozen=True)
class HashPolicyIR:
    """What ring_hash / maglev hash on: exactly one of header, cookie, source_ip."""

    header: str | None = None
    cookie: CookieIR | None = None
    source_ip: bool = False


@dataclass(frozen=True)
class RateLimitIR:
    """A token bucket: ``tokens_per_fill`` added every ``fill_interval`` seconds, at most
    ``bucket_size`` held. ``scope`` ``fleet``: the bucket is the fleet's, split into each
    Envoy's ``shares`` (node id -> tokens per fill, summing to ``tokens_per_fill``); an Envoy
    not listed (new, or before the first split) holds ``floor`` tokens per fill."""

    bucket_size: int
    tokens_per_fill: int
    fill_interval: float
    scope: str = "envoy"
    shares: tuple[tuple[str, int], ...] = ()
    floor: int = 1


@dataclass(frozen=True)
class RouteIR:
    name: str
    match: RouteMatchIR
    backends: tuple[BackendIR, ...]
    timeout: float
    retries: RetryIR | None
    access: AccessIR | None
    """None when the route is unrestricted (no access, or an empty one)."""
    rate_limit: RateLimitIR | None
    hash_policies: tuple[HashPolicyIR, ...]
    """The route's own ``hash`` first (when sticky), then one per distinct ``hash_on`` of the
    route's hashing backends, in backend order."""
    sticky: bool = False
    """The weighted backend is picked by the hash policies, not at random."""
    mirror: MirrorIR | None = None
    fault: FaultIR | None = None
    served_by_headers: bool = True
    """Answers carry x-inferway-pool / x-inferway-replica (served_by.py)."""
    llm: LlmRouteIR | None = None
    """An OpenAI-compatible route: the body's model picks it (xds/translate/llm.py)."""
