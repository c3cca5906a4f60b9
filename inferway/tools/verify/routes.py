"""The routes of a policy as verify expects a gateway to apply them: in match order (a
rollout's ``match`` entries as routes just before the rollout's route, as resolve places
them), each with its pools and their shares of the traffic.

verify reads the policy itself (not the gateway's translation of it), so a gateway that
routes differently from what the policy says is caught rather than mirrored.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from inferway.policies.errors import PolicyError, PolicyIssue, read_source_text
from inferway.policies.loader import load_policy_text
from inferway.policies.located import parse_located, place_issues
from inferway.policies.model import HeaderMatch, PathMatch, Policy, Route, RouteMatch
from inferway.policies.route_traffic import CookieMatch
from inferway.policies.traffic import HashOn
from inferway.resolve.ir.route import WEIGHT_TOTAL
from inferway.resolve.weights import resolve_backends
from inferway.tools.verify.features import FeatureRule

__all__ = ["Pool", "VerifyRoute", "load_verify_routes", "routes_of"]

Sticky = Literal["none", "header", "cookie", "client_ip"]


@dataclass(frozen=True)
class Pool:
    service: str
    share: float
    """Of the route's traffic, 0..1 (its weight over the route's total)."""


@dataclass(frozen=True)
class VerifyRoute:
    name: str
    path: PathMatch
    headers: tuple[HeaderMatch, ...]
    cookies: tuple[CookieMatch, ...]
    features: FeatureRule | None
    pools: tuple[Pool, ...]
    """The pools with a share above 0, in the policy's order."""
    sticky: Sticky = "none"
    sticky_key: str = ""
    """The header or cookie a sticky split hashes on (verify varies it per request)."""
    origin: str = ""
    """The policy route this comes from (itself, or the rollout's route for a canary match)."""
    served_by: bool = True
    """Whether its answers carry the served-by headers (a policy may turn them off)."""


def _pools(route: Route, override: Mapping[str, float] | None) -> tuple[Pool, ...]:
    """The route's weights as resolve makes them (a live rollout's override on top)."""
    if sum(b.permille for b in route.backends) == 0 and not override:
        return ()
    backends = resolve_backends(route, override)
    return tuple(Pool(b.service, b.weight / WEIGHT_TOTAL) for b in backends if b.weight > 0)


def _sticky(hash_on: HashOn | None) -> tuple[Sticky, str]:
    if hash_on is None:
        return "none", ""
    if hash_on.header is not None:
        return "header", hash_on.header
    if hash_on.cookie is not None:
        return "cookie", hash_on.cookie.name
    return "client_ip", ""


def routes_of(
    policy: Policy,
    features: dict[str, FeatureRule],
    listener_port: int | None = None,
    weights: Mapping[str, Mapping[str, float]] | None = None,
) -> list[VerifyRoute]:
    """The policy's routes served on the listener at ``listener_port`` (every route when no
    listener has that port), in match order, but its openai routes (openai_checks.py);
    ``features``: route name -> its feature rule;
    ``weights``: route name -> service -> weight, the live overrides (a rollout's step)."""
    weights = weights or {}
    names = {lst.name for lst in policy.listeners if lst.port == listener_port}
    rollouts = {r.route: r for r in policy.rollouts}
    out: list[VerifyRoute] = []
    for route in policy.routes:
        if getattr(route, "openai", None) is not None:
            continue  # routed on the body's model, not its match: openai_checks.py
        if names and route.listeners is not None and not names & set(route.listeners):
            continue
        rollout = rollouts.get(route.name)
        sticky, key = _sticky(route.hash or (rollout.sticky if rollout else None))
        # served_by_headers: the policy's and the route's (read by name: schemas before the
        # served-by headers have neither, and every answer is then assumed to carry them)
        served_by = getattr(route, "served_by_headers", None)
        if served_by is None:
            served_by = getattr(policy, "served_by_headers", True)
        base = VerifyRoute(
            name=route.name,
            path=route.match.path,
            headers=tuple(route.match.headers),
            cookies=tuple(route.match.cookies),
            features=features.get(route.name),
            pools=_pools(route, weights.get(route.name)),
            sticky=sticky,
            sticky_key=key,
            origin=route.name,
            served_by=bool(served_by),
        )
        for i, entry in enumerate(rollout.match if rollout is not None else ()):
            assert rollout is not None
            extra = tuple(
                HeaderMatch(name=h.name, exact=h.exact, prefix=h.prefix, present=h.present)
                for h in entry.headers
            )
            out.append(
                replace(
                    base,
                    name=f"{route.name}-canary-{i}",
                    headers=base.headers + extra,
                    pools=(Pool(rollout.canary, 1.0),),
                    sticky="none",
                    sticky_key="",
                )
            )
        out.append(base)
    return out


def _model_has_features() -> bool:
    return "features" in RouteMatch.model_fields


def _features_of(route: Route) -> dict[str, Any] | None:
    value = getattr(route.match, "features", None)
    if value is None:
        return None
    if hasattr(value, "model_dump"):
        dumped: dict[str, Any] = value.model_dump(exclude_none=True)
        return dumped
    return dict(value)


def load_verify_routes(
    path: str | Path,
    listener_port: int | None = None,
    weights: Mapping[str, Mapping[str, float]] | None = None,
) -> tuple[Policy, list[VerifyRoute]]:
    """Load the policy at ``path`` as the gateway would (every located error at once) and
    its routes for the listener at ``listener_port``.

    When the policy schema has no ``features`` yet, they are read from the YAML as plain
    mappings and taken out before the rest is validated (a policy for a newer gateway)."""
    source = str(path)
    text = read_source_text(path)
    raw: dict[str, dict[str, Any]] = {}
    if _model_has_features():
        policy = load_policy_text(text, source, external_endpoints=True)
        for route in policy.routes:
            found = _features_of(route)
            if found is not None:
                raw[route.name] = found
    else:
        policy, raw = _load_without_features(text, source)
    features: dict[str, FeatureRule] = {}
    issues: list[PolicyIssue] = []
    for index, route in enumerate(policy.routes):
        if route.name not in raw:
            continue
        try:
            features[route.name] = FeatureRule.model_validate(raw[route.name])
        except ValidationError as error:
            for item in error.errors(include_url=False):
                where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"])
                field = f"routes[{index}].match.features{where}"
                issues.append(PolicyIssue(source, None, None, field, item["msg"]))
    if issues:
        raise PolicyError(place_issues(text, source, issues))
    return policy, routes_of(policy, features, listener_port, weights)


def _load_without_features(text: str, source: str) -> tuple[Policy, dict[str, dict[str, Any]]]:
    document, _ = parse_located(text, source)
    data = copy.deepcopy(document.data)
    raw: dict[str, dict[str, Any]] = {}
    routes = data.get("routes") if isinstance(data, dict) else None
    for route in routes if isinstance(routes, list) else []:
        match = route.get("match") if isinstance(route, dict) else None
        if isinstance(match, dict) and "features" in match:
            raw[str(route.get("name"))] = match.pop("features") or {}
    if not raw:
        return load_policy_text(text, source, external_endpoints=True), raw
    try:
        policy = load_policy_text(yaml.safe_dump(data), source, external_endpoints=True)
    except PolicyError as error:
        unplaced = [PolicyIssue(i.file, None, None, i.path, i.message) for i in error.issues]
        raise PolicyError(place_issues(text, source, unplaced)) from None
    return policy, raw
