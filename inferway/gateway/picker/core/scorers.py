"""The scorers: each rates one candidate endpoint in [0, 1] (1 best) for one request; the
pick weighs them (``Weights``). One function per scorer, called once per candidate in the
pick's single pass (a pick over 64 endpoints must stay well under a millisecond).

queue     fewer requests waiting or running (scraped plus the picker's own in-flight count),
          against the saturation limit: 1 / (1 + depth / limit), so 1 idle, 0.5 at the limit,
          and still lower for every request beyond it. Not min-max over the
          candidates (GAIE's queue scorer): in a large pool one idle server always exists, and
          min-max would then pull every request off the server holding its prefix as soon as
          that server had one more request than the idlest (bench/picker_sim.py measured it)
kv_cache  less KV cache in use (unknown: neutral 0.5)
prefix    the share of the prompt's leading blocks already sent there
lora      the requested adapter loaded (1), loading (0.8), a free adapter slot (0.5), none (0)
session   the endpoint this session was last sent to
"""

from __future__ import annotations

from dataclasses import dataclass

from inferway.gateway.picker.core.metrics import ServerMetrics

__all__ = [
    "SCORERS",
    "Weights",
    "kv_cache_score",
    "lora_score",
    "prefix_score",
    "queue_score",
    "session_score",
]

SCORERS = ("queue", "kv_cache", "prefix", "lora", "session")


@dataclass(frozen=True, slots=True)
class Weights:
    """How much each scorer counts (0 = off). GAIE's default profile weighs queue and KV cache
    1 each and prefix 3; these defaults are the policy's."""

    queue: float = 2.0
    kv_cache: float = 2.0
    prefix: float = 3.0
    lora: float = 1.0
    session: float = 0.0

    def items(self) -> list[tuple[str, float]]:
        return [(name, float(getattr(self, name))) for name in SCORERS]


def queue_score(depth: float, limit: float) -> float:
    return 1.0 / (1.0 + depth / limit)


def kv_cache_score(used: float | None) -> float:
    return 0.5 if used is None else min(1.0, max(0.0, 1.0 - used))


def prefix_score(matched: int, total: int) -> float:
    return matched / total if total else 0.0


def lora_score(metrics: ServerMetrics, lora: str | None) -> float:
    if lora is None:
        return 1.0
    if lora in metrics.loras_running:
        return 1.0
    if lora in metrics.loras_waiting:
        return 0.8
    loaded = len(metrics.loras_running | metrics.loras_waiting)
    return 0.5 if metrics.max_lora is None or loaded < metrics.max_lora else 0.0


def session_score(endpoint: str, sticky: str | None) -> float:
    return 1.0 if endpoint == sticky else 0.0
