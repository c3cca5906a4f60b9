"""Semantic checks of routes with ``match.features``: combinations the feature router cannot
serve are refused where they are written, instead of routing wrongly.

* gRPC (http2) services get protobuf bodies, never JSON: a feature rule there could never
  match (``skip``) or would refuse everything (``reject``);
* proxyless gRPC clients (``grpc_targets``) route by themselves, without Envoy and its
  feature router, so a target naming a route with features would ignore them;
* the feature router's port must not be a listener's.
"""

from __future__ import annotations

from collections.abc import Iterator

from inferway.policies.model import Policy
from inferway.policies.yaml_marks import Loc

__all__ = ["check_features"]


def check_features(policy: Policy) -> Iterator[tuple[Loc, str]]:
    protocols = {s.name: s.protocol for s in policy.services}
    featured = {r.name for r in policy.routes if r.match.features is not None}
    for r, route in enumerate(policy.routes):
        if route.match.features is None:
            continue
        for b, backend in enumerate(route.backends):
            if protocols.get(backend.service) == "http2":
                yield (
                    ("routes", r, "match", "features"),
                    f"route '{route.name}' matches on body features but its backend "
                    f"'{backend.service}' (backends[{b}]) is an http2 (gRPC) service, whose "
                    "bodies are protobuf, not JSON; route gRPC on path or headers instead",
                )
                break
    for t, target in enumerate(policy.grpc_targets):
        if target.route is not None and target.route in featured:
            yield (
                ("grpc_targets", t, "route"),
                f"route '{target.route}' matches on body features, which only Envoy's feature "
                "router sees; proxyless gRPC clients would ignore them: name a route without "
                "features",
            )
    if featured:
        router = policy.feature_router
        for i, listener in enumerate(policy.listeners):
            if listener.port == router.port and listener.address == router.address:
                yield (
                    ("feature_router", "port"),
                    f"the feature router's port {router.port} is listener '{listener.name}' "
                    f"(listeners[{i}])'s; give the feature router another port",
                )
