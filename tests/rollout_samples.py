"""Seeded traffic windows for the rollout controller's unit tests: what a metric source would
report for one interval, with the canary's error rate and latency scale chosen per test."""

from __future__ import annotations

import math

import numpy as np

from inferway.controllers.rollout.config import (
    TOTAL_WEIGHT,
    AnalysisConfig,
    ErrorRateCheck,
    LatencyCheck,
    RolloutConfig,
    Step,
)
from inferway.controllers.rollout.evidence import VersionCounts, WindowSample

__all__ = ["BUCKET_RATIO", "TWO_VERSION_ROLLOUT", "rollout_config", "version_counts", "window"]

TWO_VERSION_ROLLOUT = """version: 1
listeners: [{name: edge, port: 18080}]
services:
  - {name: v1, endpoints: ["127.0.0.1:1"]}
  - {name: v2, endpoints: ["127.0.0.1:2"]}
routes:
  - name: inference
    backends: [{service: v1, weight: 100}, {service: v2, weight: 0}]
rollouts:
  - name: demo-v2
    route: inference
    stable: v1
    canary: v2
"""
"""A policy with one route over v1/v2 and a rollout of v2 on it, up to its steps: tests append
``steps:`` and ``analysis:`` lines."""

# Log-spaced histogram buckets (5% apart), as a configured Envoy histogram would give.
BUCKET_RATIO = 1.05


def version_counts(
    rng: np.random.Generator, requests: int, error_rate: float, latency_scale: float = 1.0
) -> VersionCounts:
    """``requests`` with Bernoulli errors and log-normal latency (median 80 ms, p99 ~200 ms)
    in log-spaced buckets."""
    errors = int(rng.binomial(requests, error_rate))
    ms = latency_scale * rng.lognormal(math.log(80.0), 0.4, requests)
    index = np.ceil(np.log(ms) / math.log(BUCKET_RATIO))
    buckets, counts = np.unique(index, return_counts=True)
    latency = {
        round(BUCKET_RATIO ** float(b), 3): int(n) for b, n in zip(buckets, counts, strict=True)
    }
    return VersionCounts(requests, errors, latency)


def window(
    rng: np.random.Generator,
    total: int,
    weight: int,
    *,
    canary_errors: float = 0.001,
    stable_errors: float = 0.001,
    canary_latency: float = 1.0,
) -> WindowSample:
    """One interval of ``total`` requests split by the canary ``weight`` (parts of 10,000)."""
    canary = round(total * weight / TOTAL_WEIGHT)
    return WindowSample(
        stable=version_counts(rng, total - canary, stable_errors),
        canary=version_counts(rng, canary, canary_errors, canary_latency),
    )


def rollout_config(
    steps: tuple[float, ...] = (1, 5, 25, 50, 100),
    *,
    on_failure: str = "rollback",
    interval_s: float = 30.0,
    history_size: int = 100,
    pauses: dict[int, float] | None = None,
    **analysis: object,
) -> RolloutConfig:
    pauses = pauses or {}
    checks = analysis.pop("checks", (ErrorRateCheck(0.005), LatencyCheck(0.2)))
    return RolloutConfig(
        name="demo-v2",
        stable="model-v1",
        canary="model-v2",
        steps=tuple(Step(p, pauses.get(i, 0.0)) for i, p in enumerate(steps)),
        analysis=AnalysisConfig(interval_s=interval_s, checks=checks, **analysis),  # type: ignore[arg-type]
        on_failure=on_failure,  # type: ignore[arg-type]
        history_size=history_size,
    )
