"""Which route, and so which pools, a request must reach under a policy: routes in order,
the first whose path, headers, cookies and features all match wins (Envoy's rule), a
feature rule with ``on_malformed: reject`` answers 400 for a non-JSON body, and a request no
route matches gets Envoy's 404.

Header matching follows Envoy's ``HeaderMatcher``: exact, prefix, RE2 regex (whole value)
or present, optionally inverted; a missing header matches only ``present: false`` (and,
inverted, only ``present: true``), as Envoy's header utility decides.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie

import re2

from inferway.policies.model import HeaderMatch, PathMatch
from inferway.policies.route_traffic import CookieMatch
from inferway.tools.verify.features import Verdict, match_features
from inferway.tools.verify.routes import Pool, VerifyRoute

__all__ = ["Expected", "Outcome", "Probe", "expect", "parse_cookies"]


@dataclass(frozen=True)
class Probe:
    """One request verify sends: what it covers, and everything routing may look at."""

    covers: str
    path: str
    headers: tuple[tuple[str, str], ...]
    """Lower-case names; a ``cookie`` header carries the cookies."""
    body: bytes

    def header_map(self) -> dict[str, str]:
        return dict(self.headers)


class Outcome(enum.StrEnum):
    pool = "pool"
    reject = "reject"
    """400 from the gateway: a feature rule with ``on_malformed: reject``."""
    no_route = "no_route"
    """404 from Envoy: no route matches."""


@dataclass(frozen=True)
class Expected:
    outcome: Outcome
    route: str | None
    pools: tuple[Pool, ...] = ()

    @property
    def services(self) -> frozenset[str]:
        return frozenset(p.service for p in self.pools)


def _path_matches(match: PathMatch, path: str) -> bool:
    path = path.partition("?")[0]
    if match.prefix is not None:
        return path.startswith(match.prefix)
    if match.exact is not None:
        return path == match.exact
    assert match.regex is not None  # PathMatch holds exactly one
    return re2.fullmatch(match.regex, path) is not None


def _header_matches(match: HeaderMatch, headers: Mapping[str, str]) -> bool:
    value = headers.get(match.name.lower())
    if value is None:
        if match.invert:
            return match.present is True
        return match.present is False
    if match.present is not None:
        result = match.present
    elif match.exact is not None:
        result = value == match.exact
    elif match.prefix is not None:
        result = value.startswith(match.prefix)
    else:
        assert match.regex is not None  # HeaderMatch holds exactly one
        result = re2.fullmatch(match.regex, value) is not None
    return result != match.invert


def parse_cookies(header: str) -> dict[str, str]:
    """A ``cookie`` header's name -> value (an unparsable header holds none)."""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in jar.items()}


def _cookie_matches(match: CookieMatch, cookies: Mapping[str, str]) -> bool:
    if match.present is not None:
        return (match.name in cookies) == match.present
    return cookies.get(match.name) == match.exact


def expect(routes: Sequence[VerifyRoute], probe: Probe) -> Expected:
    """Where ``probe`` must go under ``routes`` (in match order)."""
    headers = probe.header_map()
    cookies = parse_cookies(headers.get("cookie", ""))
    for route in routes:
        if not _path_matches(route.path, probe.path):
            continue
        if not all(_header_matches(h, headers) for h in route.headers):
            continue
        if not all(_cookie_matches(c, cookies) for c in route.cookies):
            continue
        if route.features is not None:
            verdict = match_features(route.features, probe.body)
            if verdict is Verdict.malformed and route.features.on_malformed == "reject":
                return Expected(Outcome.reject, route.name)
            if verdict is not Verdict.match:
                continue
        return Expected(Outcome.pool, route.name, route.pools)
    return Expected(Outcome.no_route, None)
