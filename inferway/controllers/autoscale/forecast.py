"""A small additive Holt-Winters forecaster and a record of how wrong it has been.

Hand-rolled (no statsmodels): the autoscaler feeds it one value per bucket, online, and asks
for the next few buckets; that is a few lines of exponential smoothing, not a fitting library.
Damped trend (``phi``) keeps a long horizon from running away on a short-lived slope. With a
season, the first full season initialises level and seasonal indices (forecasts are None
until then); without one it is Holt's double exponential smoothing.
"""

from __future__ import annotations

from collections import deque

__all__ = ["ForecastError", "HoltWinters"]


class HoltWinters:
    def __init__(
        self, *, alpha: float, beta: float, gamma: float, phi: float, season_length: int | None
    ) -> None:
        if season_length is not None and season_length < 2:
            raise ValueError(f"season_length must be >= 2, got {season_length}")
        self._alpha, self._beta, self._gamma, self._phi = alpha, beta, gamma, phi
        self._m = season_length
        self._level: float | None = None
        self._trend = 0.0
        self._seasonal: list[float] = []
        self._first: list[float] = []
        self.observed = 0

    @property
    def ready(self) -> bool:
        return self._level is not None

    def update(self, y: float) -> None:
        t = self.observed
        self.observed += 1
        m = self._m
        if self._level is None:
            if m is None:
                self._level = y
                return
            self._first.append(y)
            if len(self._first) == m:
                self._level = sum(self._first) / m
                self._seasonal = [v - self._level for v in self._first]
                self._first = []
            return
        a, b, g, phi = self._alpha, self._beta, self._gamma, self._phi
        season = self._seasonal[t % m] if m is not None else 0.0
        level = a * (y - season) + (1 - a) * (self._level + phi * self._trend)
        self._trend = b * (level - self._level) + (1 - b) * phi * self._trend
        self._level = level
        if m is not None:
            self._seasonal[t % m] = g * (y - level) + (1 - g) * season

    def forecast(self, h: int) -> float | None:
        """The value ``h`` >= 1 steps after the last update (None before initialisation)."""
        if self._level is None:
            return None
        damp = sum(self._phi**k for k in range(1, h + 1))
        season = self._seasonal[(self.observed + h - 1) % self._m] if self._m is not None else 0.0
        return self._level + damp * self._trend + season


class ForecastError:
    """Mean relative error of the last ``window`` forecasts, each scored when its bucket closes.

    The error of one forecast is ``|forecast - actual| / max(|forecast|, |actual|)``: in [0, 1],
    and a forecast of 0 for a quiet bucket is not an infinite error.
    """

    def __init__(self, window: int) -> None:
        self._pending: dict[int, float] = {}
        self._errors: deque[float] = deque(maxlen=window)

    def expect(self, bucket: int, value: float) -> None:
        self._pending[bucket] = value

    def score(self, bucket: int, actual: float) -> None:
        for old in [k for k in self._pending if k < bucket]:
            del self._pending[old]
        predicted = self._pending.pop(bucket, None)
        if predicted is None:
            return
        scale = max(abs(predicted), abs(actual))
        self._errors.append(0.0 if scale == 0 else abs(predicted - actual) / scale)

    @property
    def scored(self) -> int:
        return len(self._errors)

    @property
    def mean(self) -> float | None:
        return sum(self._errors) / len(self._errors) if self._errors else None
