"""Load traces for bench/autoscale_sim.py: per-second arrival counts (Poisson around a shape).

All seeded, so every controller sees the same arrivals. Rates are in requests per second for
the heavy model (one replica holds ~466 req/s at the controllers' shared 60% target).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Trace", "build_traces"]


@dataclass(frozen=True)
class Trace:
    name: str
    description: str
    shape: list[float]  # the noiseless rate per second
    arrivals: list[float]  # what arrives, second by second
    measure_from_s: int = 0  # seconds before this are warm-up (not scored)
    ramps: tuple[tuple[int, int], ...] = ()  # (start, end) seconds of the ramps to time


def _poisson(shape: np.ndarray, rng: np.random.Generator) -> list[float]:
    return rng.poisson(np.maximum(shape, 0.0)).astype(float).tolist()


def _step(rng: np.random.Generator, scale: float) -> Trace:
    t = np.arange(int(2700 * scale))
    up, down = int(600 * scale), int(1800 * scale)
    shape = np.where((t >= up) & (t < down), 5000.0, 1000.0)
    return Trace(
        "step-5x",
        f"1,000 -> 5,000 req/s at {up} s, back at {down} s",
        shape.tolist(),
        _poisson(shape, rng),
    )


def _spike(rng: np.random.Generator, scale: float) -> Trace:
    t = np.arange(int(1800 * scale))
    start = int(600 * scale)
    shape = np.where((t >= start) & (t < start + 60), 6000.0, 1000.0)
    return Trace(
        "spike",
        f"1,000 req/s with 6,000 for 60 s at {start} s",
        shape.tolist(),
        _poisson(shape, rng),
    )


def _ramp(rng: np.random.Generator, scale: float) -> Trace:
    t = np.arange(int(3600 * scale)).astype(float)
    start, length = 300 * scale, 1800 * scale
    shape = 1000.0 + 5000.0 * np.clip((t - start) / length, 0.0, 1.0)
    return Trace(
        "slow-ramp",
        f"1,000 -> 6,000 req/s over {length:g} s, then held",
        shape.tolist(),
        _poisson(shape, rng),
        ramps=((int(start), int(start + length)),),
    )


# hour -> req/s: a quiet night, a sharp 08:00 office ramp, a lunch dip, an evening peak
_DAY = [
    (0, 900),
    (5, 600),
    (7.5, 800),
    (8.0, 2600),
    (8.5, 4400),
    (9.5, 4600),
    (12, 4800),
    (13, 3900),
    (14, 4500),
    (17, 4300),
    (19, 5400),
    (21, 4600),
    (23, 1800),
    (24, 900),
]


def _diurnal(rng: np.random.Generator, days: int) -> Trace:
    hours = np.arange(days * 86400) / 3600.0
    xs, ys = zip(*_DAY, strict=True)
    base = np.interp(hours % 24, xs, ys)
    day_scale = np.repeat(rng.normal(1.0, 0.04, size=days), 86400)
    minutes = days * 1440
    ar = np.zeros(minutes)  # slow AR(1) noise, ~6% sd, one value a minute
    for i in range(1, minutes):
        ar[i] = 0.9 * ar[i - 1] + rng.normal(0.0, 0.026)
    noise = np.repeat(ar, 60)
    shape = base * day_scale * (1.0 + noise)
    ramps = tuple((d * 86400 + 7 * 3600, d * 86400 + 10 * 3600) for d in range(1, days))
    return Trace(
        "diurnal",
        f"{days} days, sharp 08:00 ramp, +-6% minute noise "
        "(day 1 warms up the forecaster, unscored)",
        shape.tolist(),
        _poisson(shape, rng),
        measure_from_s=86400,
        ramps=ramps,
    )


def build_traces(*, quick: bool, seed: int = 14) -> list[Trace]:
    """The four traces; each has its own random stream, so --quick changes only the diurnal."""

    def rng(i: int) -> np.random.Generator:
        return np.random.default_rng([seed, i])

    return [
        _step(rng(0), 1.0),
        _diurnal(rng(1), 2 if quick else 3),
        _spike(rng(2), 1.0),
        _ramp(rng(3), 1.0),
    ]
