"""Semantic checks of ``openai`` routes: what the LLM processor could not serve as written.

* a model name (or alias) served by two routes under one prefix: the body's ``model`` must
  pick exactly one route;
* an ``openai`` route's paths are its prefix's OpenAI endpoints, so a ``match.path`` or
  ``match.features`` of its own is refused rather than silently ignored;
* the route ``timeout`` would cut streams: ``openai.timeout`` is the one used;
* gRPC (http2) services get protobuf, not OpenAI JSON;
* the LLM processor must not take a listener's port or the feature router's, nor may its
  reports port (``reports_port``, default ``port + 1``) take either or its own gRPC port.
"""

from __future__ import annotations

from collections.abc import Iterator

from inferway.policies.model import Policy, Route
from inferway.policies.yaml_marks import Loc

__all__ = ["check_llm"]


def check_llm(policy: Policy) -> Iterator[tuple[Loc, str]]:
    protocols = {s.name: s.protocol for s in policy.services}
    names: dict[tuple[str, str], str] = {}
    any_llm = False
    for r, route in enumerate(policy.routes):
        openai = route.openai
        if openai is None:
            continue
        any_llm = True
        loc: Loc = ("routes", r, "openai")
        given = {"path": route.match.path.prefix != "/", "features": route.match.features}
        for key, value in given.items():
            if value:
                yield (
                    ("routes", r, "match", key),
                    f"route '{route.name}' is an openai route: its paths are "
                    f"{openai.prefix}/chat/completions, /completions and /embeddings and the "
                    f"body's model picks it; remove match.{key} (headers may stay)",
                )
        if route.timeout != Route.model_fields["timeout"].default:
            yield (
                ("routes", r, "timeout"),
                f"route '{route.name}' is an openai route: its answers may stream for long, so "
                "the route timeout is not used; set openai.timeout (0: none) and "
                "openai.idle_timeout instead",
            )
        for name in (openai.model, *openai.aliases):
            other = names.setdefault((openai.prefix, name), route.name)
            if other != route.name:
                yield (
                    loc,
                    f"model '{name}' under {openai.prefix} is served by route '{other}' "
                    f"already; route '{route.name}' would never get it (one route per model)",
                )
        for b, backend in enumerate(route.backends):
            if protocols.get(backend.service) == "http2":
                yield (
                    ("routes", r, "backends", b, "service"),
                    f"route '{route.name}' is an openai route but service '{backend.service}' "
                    "is http2 (gRPC); OpenAI-compatible engines speak HTTP/1.1 JSON",
                )
    if any_llm:
        yield from _port(policy)


def _port(policy: Policy) -> Iterator[tuple[Loc, str]]:
    llm = policy.llm
    for listener in policy.listeners:
        if (listener.address, listener.port) == (llm.address, llm.port):
            yield (
                ("llm", "port"),
                f"the LLM processor's port {llm.port} is listener '{listener.name}''s; "
                "give it another port",
            )
    router = policy.feature_router
    if (router.address, router.port) == (llm.address, llm.port):
        yield ("llm", "port"), f"the LLM processor's port {llm.port} is the feature router's"
    reports = llm.report_port
    where: Loc = ("llm", "reports_port") if llm.reports_port is not None else ("llm", "port")
    taken = {(lis.address, lis.port): f"listener '{lis.name}''s" for lis in policy.listeners}
    taken[(router.address, router.port)] = "the feature router's"
    taken[(llm.address, llm.port)] = "the LLM processor's gRPC port"
    owner = taken.get((llm.address, reports))
    if owner is not None:
        yield (
            where,
            f"the LLM processor's reports port {reports} (llm.reports_port, default port + 1) "
            f"is {owner}; set llm.reports_port to a free one",
        )
