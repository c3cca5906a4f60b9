"""IR of a route: match, weighted backends (overrides applied), retries, limits, affinity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inferway.resolve.ir.access import AccessIR

__all__ = [
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


@dataclass(frozen=True)
class BackendIR:
    service: str
    permille: int
    """Weight in tenths of a percent (the policy's 0.1-resolution weight, or its override)."""


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
    ``bucket_size`` held."""

    bucket_size: int
    tokens_per_fill: int
    fill_interval: float


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
    """One per distinct ``hash_on`` of the route's hashing backends, in backend order."""
