"""Semantic checks of routes with ``match.features``: combinations the feature router cannot
serve are refused where they are written, instead of routing wrongly.

* gRPC (http2) services get protobuf bodies, never JSON: a feature rule there could never
  match (``skip``) or would refuse everything (``reject``);
* proxyless gRPC clients (``grpc_targets``) route by themselves, without Envoy and its
  feature router, so a target naming a route with features would ignore them;
* inferway's own servers (the feature router, the mask sink) must not take a listener's
  port, nor each other's.
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
    yield from _own_ports(policy, bool(featured))


def _own_ports(policy: Policy, featured: bool) -> Iterator[tuple[Loc, str]]:
    taken = {(x.address, x.port): f"listener '{x.name}'" for x in policy.listeners}
    own: list[tuple[Loc, str, str, int]] = []
    if featured:
        router = policy.feature_router
        own.append((("feature_router", "port"), "the feature router", router.address, router.port))
    if policy.mask is not None:
        sink = policy.mask.sink
        own.append((("mask", "sink", "port"), "the mask sink", sink.address, sink.port))
    for loc, what, address, port in own:
        holder = taken.get((address, port))
        if holder is not None:
            yield loc, f"{what}'s port {port} is {holder}'s; give it another port"
        taken[(address, port)] = what
