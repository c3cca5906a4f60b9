"""``openai`` routes into the IR: their paths, their stream-friendly defaults (no total
timeout, retries that fall back to another replica on 429 and 5xx), and the LLM processor."""

from __future__ import annotations

import re
from collections.abc import Iterable

from inferway.policies.llm import LlmGateway
from inferway.policies.model import Policy, Retries, Route
from inferway.resolve.ir.llm import LlmGatewayIR, LlmRouteIR
from inferway.resolve.ir.route import PathMatchIR, RouteIR

__all__ = [
    "LLM_ENDPOINTS",
    "llm_default_retries",
    "llm_health_paths",
    "llm_path",
    "resolve_llm_gateway",
    "resolve_llm_route",
]

LLM_ENDPOINTS = ("chat/completions", "completions", "embeddings")
"""What an ``openai`` route serves under its prefix (``models`` is answered by Envoy)."""


def llm_path(prefix: str) -> PathMatchIR:
    """One RE2 regex for the prefix's three endpoints (the query string is not matched)."""
    endpoints = "|".join(LLM_ENDPOINTS)
    return PathMatchIR(kind="regex", value=f"{re.escape(prefix)}/({endpoints})")


def resolve_llm_route(route: Route) -> LlmRouteIR | None:
    openai = route.openai
    if openai is None:
        return None
    return LlmRouteIR(
        model=openai.model,
        aliases=tuple(openai.aliases),
        prefix=openai.prefix,
        idle_timeout=openai.idle_timeout,
        timeout=openai.timeout,
        ask_for_usage=openai.ask_for_usage,
    )


def llm_default_retries() -> Retries:
    """Without ``retries``: two more tries on another replica for a refused or failed
    attempt (429, 5xx, reset, connect failure). Envoy retries only before it has sent the
    client a response's headers, so a stream that started is never replayed."""
    return Retries(
        attempts=2,
        on=["connect-failure", "reset", "5xx", "retriable-status-codes"],
        retriable_status_codes=[429],
    )


def llm_health_paths(policy: Policy) -> dict[str, str]:
    """Service -> ``<prefix>/models`` for the backends of ``openai`` routes: OpenAI-compatible
    engines (vLLM, llama.cpp, TGI, SGLang) answer it, not the Open Inference Protocol's
    readiness path, so that is their default probe (a service's ``health_check`` wins)."""
    paths: dict[str, str] = {}
    for route in policy.routes:
        if route.openai is not None:
            for backend in route.backends:
                paths.setdefault(backend.service, f"{route.openai.prefix}/models")
    return paths


def resolve_llm_gateway(settings: LlmGateway, routes: Iterable[RouteIR]) -> LlmGatewayIR | None:
    """None unless some route is an ``openai`` one: no filter, no cluster otherwise."""
    if not any(r.llm is not None for r in routes):
        return None
    return LlmGatewayIR(
        host=settings.address,
        port=settings.port,
        reports_port=settings.report_port,
        timeout=settings.timeout,
        max_body_bytes=settings.max_body_bytes,
        transport=settings.transport,
        # ext_proc streams are reported on by the Lua filter as they go (no access log lane)
        stream_reader=(
            "auto" if settings.stream_reader == "auto" and settings.transport == "http" else "lua"
        ),
        client_header=settings.client_key.header,
        limited=(
            settings.limits.tokens_per_minute is not None
            or settings.limits.tokens_per_day is not None
        ),
    )
