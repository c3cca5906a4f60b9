"""Semantic check across features: the servers the gateway runs for a policy (the LLM
processor and its reports port, inferway's own endpoint pickers, the mask sink, the feature
router) and its listeners each need their own address. Their defaults are apart (18091 to
18096), but a port set in the policy can meet another server's; without this check the
second to bind would fail at run time and its feature would fail closed.

Pairs other checks already name are left to them: the LLM processor against listeners and the
feature router (checks_llm.py), pickers against each other (checks_picker.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from inferway.policies.model import Policy
from inferway.policies.types import split_host_port
from inferway.policies.yaml_marks import Loc

__all__ = ["check_ports"]

_CHECKED_ELSEWHERE = (frozenset({"llm", "listener"}), frozenset({"llm", "router"}))


@dataclass(frozen=True)
class _Server:
    kind: str
    what: str
    loc: Loc


def _servers(policy: Policy) -> Iterator[tuple[tuple[str, int], _Server]]:
    """Every address the policy's gateway binds, with what binds it (in policy order)."""
    for i, listener in enumerate(policy.listeners):
        yield (
            (listener.address, listener.port),
            _Server("listener", f"listener '{listener.name}'", ("listeners", i, "port")),
        )
    if any(r.openai is not None for r in policy.routes):
        llm = policy.llm
        yield (llm.address, llm.port), _Server("llm", "the LLM processor", ("llm", "port"))
        where: Loc = ("llm", "reports_port") if llm.reports_port is not None else ("llm", "port")
        reports = _Server("llm", "the LLM processor's reports port", where)
        yield (llm.address, llm.report_port), reports
    for i, service in enumerate(policy.services):
        picker = service.picker
        if picker is None or picker.external is not None or picker.process == "envoy":
            continue
        yield (
            split_host_port(picker.listen),
            _Server("picker", f"service '{service.name}''s picker", ("services", i, "picker")),
        )
        if picker.transport == "http":
            lane = f"service '{service.name}''s picker http_listen"
            loc: Loc = ("services", i, "picker", "http_listen")
            yield split_host_port(picker.http_listen), _Server("picker", lane, loc)
    observability = policy.observability
    if policy.mask is not None and observability is not None:
        logging_on = observability.access_log is not None and observability.access_log.enabled
        if logging_on or observability.tracing is not None:
            sink = policy.mask.sink
            yield (sink.address, sink.port), _Server("mask", "the mask sink", ("mask", "sink"))
    if any(r.match.features is not None for r in policy.routes):
        router = policy.feature_router
        yield (
            (router.address, router.port),
            _Server("router", "the feature router", ("feature_router", "port")),
        )


_WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def _overlap(a: str, b: str) -> bool:
    """Two hosts on one port collide when equal or when either is a wildcard."""
    return a == b or a in _WILDCARDS or b in _WILDCARDS


def check_ports(policy: Policy) -> Iterator[tuple[Loc, str]]:
    seen: list[tuple[tuple[str, int], _Server]] = []
    for address, server in _servers(policy):
        host, port = address
        for (other_host, other_port), owner in seen:
            if other_port != port or owner.kind == server.kind or not _overlap(host, other_host):
                continue
            covered = frozenset({owner.kind, server.kind}) in _CHECKED_ELSEWHERE
            if covered and host == other_host:
                continue
            yield (
                server.loc,
                f"{server.what} would listen on {host}:{port}, which is {owner.what}'s "
                f"({other_host}:{other_port}); give one of them another port",
            )
            break
        seen.append((address, server))
