"""The scorers: each rates every candidate endpoint in [0, 1] (1 best) for one request, from
the endpoint's load view and the request; the pick weighs them (``Weights``).

queue     fewer requests waiting or running (scraped plus the picker's own in-flight count)
kv_cache  less KV cache in use (unknown: neutral 0.5)
prefix    the longest run of the prompt's leading blocks already sent there
lora      the requested adapter loaded (1), loading (0.8), a free adapter slot (0.5), none (0)
session   the endpoint this session was last sent to
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from inferway.gateway.picker.core.metrics import ServerMetrics

__all__ = ["SCORERS", "EndpointView", "Request", "Weights", "score_all"]

SCORERS = ("queue", "kv_cache", "prefix", "lora", "session")


@dataclass(frozen=True, slots=True)
class Weights:
    """How much each scorer counts (0 = off). GAIE's default profile weighs queue and KV cache
    1 each and prefix 3 (its ``default-profile``); these defaults are the policy's."""

    queue: float = 2.0
    kv_cache: float = 2.0
    prefix: float = 3.0
    lora: float = 1.0
    session: float = 0.0

    def items(self) -> list[tuple[str, float]]:
        return [(name, float(getattr(self, name))) for name in SCORERS]


@dataclass(frozen=True, slots=True)
class EndpointView:
    """What the picker knows of one endpoint at pick time."""

    depth: float
    """Requests waiting or running: the scrape's, plus those picked since it still open."""
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    prefix_blocks: int = 0
    """Leading prompt blocks this endpoint holds (from the prefix index)."""


@dataclass(frozen=True, slots=True)
class Request:
    blocks: Sequence[int] = ()
    lora: str | None = None
    session_endpoint: str | None = None


def _queue(views: Mapping[str, EndpointView]) -> dict[str, float]:
    low = min(v.depth for v in views.values())
    high = max(v.depth for v in views.values())
    if high == low:
        return dict.fromkeys(views, 1.0)
    return {e: (high - v.depth) / (high - low) for e, v in views.items()}


def _kv_cache(views: Mapping[str, EndpointView]) -> dict[str, float]:
    out = {}
    for endpoint, view in views.items():
        used = view.metrics.kv_cache
        out[endpoint] = 0.5 if used is None else min(1.0, max(0.0, 1.0 - used))
    return out


def _prefix(views: Mapping[str, EndpointView], request: Request) -> dict[str, float]:
    total = len(request.blocks)
    return {e: (v.prefix_blocks / total if total else 0.0) for e, v in views.items()}


def _lora(views: Mapping[str, EndpointView], request: Request) -> dict[str, float]:
    if request.lora is None:
        return dict.fromkeys(views, 1.0)
    out = {}
    for endpoint, view in views.items():
        m = view.metrics
        if request.lora in m.loras_running:
            out[endpoint] = 1.0
        elif request.lora in m.loras_waiting:
            out[endpoint] = 0.8
        elif m.max_lora is None or len(m.loras_running | m.loras_waiting) < m.max_lora:
            out[endpoint] = 0.5
        else:
            out[endpoint] = 0.0
    return out


def _session(views: Mapping[str, EndpointView], request: Request) -> dict[str, float]:
    return {e: float(e == request.session_endpoint) for e in views}


def score_all(views: Mapping[str, EndpointView], request: Request) -> dict[str, dict[str, float]]:
    """Scorer -> endpoint -> score, every scorer over ``views`` (none may be empty)."""
    if not views:
        raise ValueError("score_all: no candidate endpoints")
    return {
        "queue": _queue(views),
        "kv_cache": _kv_cache(views),
        "prefix": _prefix(views, request),
        "lora": _lora(views, request),
        "session": _session(views, request),
    }
