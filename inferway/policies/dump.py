"""Write a Policy back as YAML that :func:`load_policy_text` accepts unchanged.

The demo and canary tooling change a policy programmatically (e.g. shift weights) and hand
the result to the same loader a person's file goes through, so the output must round-trip
exactly: durations are written as ``"250ms"``/``"2s"`` only when that reads back as the
same float, endpoints as ``"host:port"`` when nothing else is set.
"""

from __future__ import annotations

from typing import Any

import yaml

from inferway.policies.model import Endpoint, Policy, Retries, Route, Service
from inferway.policies.types import parse_duration

__all__ = ["dump_policy"]


def _duration(seconds: float) -> str | float:
    as_s, as_ms = f"{seconds:g}s", f"{seconds * 1000:g}ms"
    candidates = (as_s, as_ms) if seconds >= 1 or seconds == 0 else (as_ms, as_s)
    for text in candidates:
        if "e" not in text and parse_duration(text) == seconds:
            return text
    return seconds


def _endpoint(endpoint: Endpoint) -> str | dict[str, Any]:
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    plain = endpoint.zone is None and endpoint.region is None
    if plain and endpoint.priority == 0 and endpoint.weight == 1:
        return f"{host}:{endpoint.port}"
    data = endpoint.model_dump(exclude_none=True)
    return data


def _service(service: Service) -> dict[str, Any]:
    data = service.model_dump(exclude_none=True)
    data["connect_timeout"] = _duration(service.connect_timeout)
    data["endpoints"] = [_endpoint(e) for e in service.endpoints]
    if service.autoscale is not None:  # as written: its defaults depend on its algorithm
        data["autoscale"] = service.autoscale.model_dump(exclude_unset=True)
    return data


def _retries(retries: Retries) -> dict[str, Any]:
    data = retries.model_dump(exclude_none=True)
    if retries.per_try_timeout is not None:
        data["per_try_timeout"] = _duration(retries.per_try_timeout)
    return data


def _route(route: Route) -> dict[str, Any]:
    data = route.model_dump(exclude_none=True)
    data["timeout"] = _duration(route.timeout)
    if route.retries is not None:
        data["retries"] = _retries(route.retries)
    return data


def dump_policy(policy: Policy) -> str:
    """YAML text for ``policy``; ``load_policy_text(dump_policy(p)) == p``."""
    data = {
        "version": policy.version,
        "listeners": [x.model_dump(exclude_none=True) for x in policy.listeners],
        "services": [_service(s) for s in policy.services],
        "routes": [_route(r) for r in policy.routes],
    }
    if policy.redact_headers:
        data["redact_headers"] = list(policy.redact_headers)
    if policy.observability is not None:
        data["observability"] = policy.observability.model_dump(exclude_none=True)
    if policy.grpc_targets:
        data["grpc_targets"] = [t.model_dump(exclude_none=True) for t in policy.grpc_targets]
    if policy.rollouts:
        data["rollouts"] = [r.model_dump(exclude_none=True) for r in policy.rollouts]
    if not policy.served_by_headers:
        data["served_by_headers"] = False
    if policy.mask is not None:
        data["mask"] = policy.mask.model_dump()
    if "feature_router" in policy.model_fields_set:
        data["feature_router"] = policy.feature_router.model_dump()
    if "llm" in policy.model_fields_set:
        data["llm"] = policy.llm.model_dump(exclude_none=True)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
