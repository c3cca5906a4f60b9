"""Seeded request traces for the rollout simulation, cut into windows at a given weight.

Every controller replays the same trace for a given (scenario, seed): each request has an
arrival time, a routing draw, an error draw and a latency draw, and which version serves it
depends only on the weight in force when it arrives. So the baseline and inferway face the
same requests, the same would-be errors and the same latencies (common random numbers), and
differ only in their decisions. The trace is made lazily in fixed chunks, each seeded by
(seed, chunk), so a controller that decides early never pays for the hours it did not need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["BUCKET_RATIO", "Scenario", "Trace", "Window"]

CHUNK_S = 600.0
# Latency histogram buckets 5% apart, as a configured Envoy histogram would give.
BUCKET_RATIO = 1.05
_LOG_RATIO = math.log(BUCKET_RATIO)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A traffic level and how the canary differs from stable."""

    name: str
    rate: float  # requests per second, both versions together
    stable_error: float
    canary_error: float
    canary_latency: float  # latency multiplier (1.3 = every quantile, so p99, +30%)
    horizon_s: float
    median_ms: float = 80.0
    sigma: float = 0.4  # log-normal: p99 = median * e^(2.326 sigma) = 203 ms

    @property
    def bad(self) -> bool:
        return self.canary_error > self.stable_error or self.canary_latency > 1.0


@dataclass(frozen=True, slots=True)
class Window:
    """What one analysis window served, per version."""

    start: float
    end: float
    canary_requests: int
    canary_errors: int
    stable_requests: int
    stable_errors: int
    canary_latency_ms: np.ndarray
    stable_latency_ms: np.ndarray

    @staticmethod
    def histogram(latency_ms: np.ndarray) -> dict[float, int]:
        """Value -> count in log buckets (each count at its bucket's upper bound)."""
        if latency_ms.size == 0:
            return {}
        index = np.ceil(np.log(latency_ms) / _LOG_RATIO)
        buckets, counts = np.unique(index, return_counts=True)
        return {
            round(BUCKET_RATIO ** float(b), 3): int(n) for b, n in zip(buckets, counts, strict=True)
        }


class Trace:
    """One seeded run's requests, generated chunk by chunk on demand."""

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.seed = seed
        self._chunks: dict[int, tuple[np.ndarray, ...]] = {}

    def _chunk(self, k: int) -> tuple[np.ndarray, ...]:
        if k not in self._chunks:
            rng = np.random.default_rng([self.seed, k, round(self.scenario.rate * 1000)])
            n = int(rng.poisson(self.scenario.rate * CHUNK_S))
            times = np.sort(rng.uniform(k * CHUNK_S, (k + 1) * CHUNK_S, n))
            route = rng.random(n)
            error = rng.random(n)
            latency = self.scenario.median_ms * np.exp(self.scenario.sigma * rng.standard_normal(n))
            self._chunks[k] = (times, route, error, latency)
        return self._chunks[k]

    def window(self, start: float, end: float, canary_share: float) -> Window:
        """Requests arriving in ``[start, end)``, the canary taking ``canary_share`` of them."""
        s = self.scenario
        parts: list[tuple[np.ndarray, ...]] = []
        for k in range(int(start // CHUNK_S), math.ceil(end / CHUNK_S)):
            times, route, error, latency = self._chunk(k)
            lo, hi = np.searchsorted(times, [start, end])
            parts.append((route[lo:hi], error[lo:hi], latency[lo:hi]))
        route = np.concatenate([p[0] for p in parts])
        error = np.concatenate([p[1] for p in parts])
        latency = np.concatenate([p[2] for p in parts])
        to_canary = route < canary_share
        c_err = error[to_canary] < s.canary_error
        s_err = error[~to_canary] < s.stable_error
        return Window(
            start=start,
            end=end,
            canary_requests=int(to_canary.sum()),
            canary_errors=int(c_err.sum()),
            stable_requests=int((~to_canary).sum()),
            stable_errors=int(s_err.sum()),
            canary_latency_ms=latency[to_canary] * s.canary_latency,
            stable_latency_ms=latency[~to_canary],
        )
