"""Predictive scaling: replicas for the forecast peak of the next horizon, ready in advance.

The metric's mean per bucket feeds a Holt-Winters forecaster. A decision asks for the larger
of the reactive (proportional) recommendation and the replicas the forecast peak of the next
``horizon_s`` needs, so capacity started now is ready when the load arrives, and the forecast
can only add replicas, never take away what the present load needs. When an accurate forecast
agrees that the present, lower need holds for the whole horizon, the scale-in is ``settled``
and skips the down-stabilization window. When the forecaster is
not initialised or its recent error exceeds ``max_error`` it falls back to reactive alone.
"""

from __future__ import annotations

import math
from typing import Any

from inferway.controllers.autoscale.decision import Recommendation
from inferway.controllers.autoscale.forecast import ForecastError, HoltWinters
from inferway.controllers.autoscale.params import PredictiveParams
from inferway.controllers.autoscale.reactive import ProportionalRecommender
from inferway.controllers.autoscale.samples import (
    MetricSample,
    SampleWindow,
    needed_replicas,
)

__all__ = ["PredictiveRecommender"]


class PredictiveRecommender:
    name = "predictive"

    def __init__(self, metric: str, params: PredictiveParams) -> None:
        self._metric = metric
        self._p = params
        self._reactive = ProportionalRecommender(metric, params.reactive)
        season = None if params.season_s is None else round(params.season_s / params.bucket_s)
        self._model = HoltWinters(
            alpha=params.alpha,
            beta=params.beta,
            gamma=params.gamma,
            phi=params.phi,
            season_length=season,
        )
        self._lead = max(1, math.ceil(params.horizon_s / params.bucket_s))
        self._errors = ForecastError(params.error_window)
        self._bucket: int | None = None
        self._sum = 0.0
        self._count = 0
        self._last_mean: float | None = None

    def observe(self, sample: MetricSample) -> None:
        value = sample.value(self._metric)
        if value is None:
            return
        bucket = math.floor(sample.time / self._p.bucket_s)
        if self._bucket is None:
            self._bucket = bucket
        while bucket > self._bucket:
            self._close()
        self._sum += value
        self._count += 1

    def _close(self) -> None:
        """Feed the finished bucket (its mean, or the last mean when it had no sample)."""
        assert self._bucket is not None
        mean = self._sum / self._count if self._count else self._last_mean
        if mean is not None:
            self._errors.score(self._bucket, mean)
            self._model.update(mean)
            self._last_mean = mean
            ahead = self._model.forecast(self._lead)
            if ahead is not None:
                self._errors.expect(self._bucket + self._lead, ahead)
        self._bucket += 1
        self._sum, self._count = 0.0, 0

    def recommend(
        self, now: float, window: SampleWindow, *, current: int, ready: int
    ) -> Recommendation:
        p = self._p
        reactive = self._reactive.recommend(now, window, current=current, ready=ready)
        error = self._errors.mean
        forecasts = [self._model.forecast(h) for h in range(1, self._lead + 2)]
        peak = max((f for f in forecasts if f is not None), default=None)
        detail: dict[str, Any] = {
            "forecast_peak": peak,
            "forecast_error": error,
            "forecasts_scored": self._errors.scored,
            "horizon_s": p.horizon_s,
            "reactive": reactive.replicas,
        }
        inputs = dict(reactive.inputs)
        if peak is None or error is None or error > p.max_error:
            why = (
                "forecaster not initialised"
                if peak is None or error is None
                else f"forecast error {error:.2f} > {p.max_error:g}"
            )
            detail["mode"] = "reactive"
            return Recommendation(
                reactive.replicas,
                inputs,
                f"{why}: reactive, {reactive.reason}",
                detail,
                tolerance=reactive.tolerance,
            )
        ahead = needed_replicas(
            self._metric, peak * p.headroom, ready=ready, target=p.reactive.target
        )
        detail["mode"] = "forecast"
        detail["forecast_replicas"] = ahead
        inputs["forecast_peak"] = peak
        now_needed = reactive.replicas if reactive.replicas is not None else 0.0
        tolerance = p.reactive.tolerance_up
        if ahead > now_needed and current > 0 and abs(ahead / current - 1.0) <= tolerance:
            return Recommendation(
                max(now_needed, float(current)),
                inputs,
                f"forecast peak {peak:g} needs {ahead:.2f}: within tolerance of {current}",
                detail,
                tolerance=reactive.tolerance,
            )
        if ahead > now_needed:
            return Recommendation(
                ahead,
                inputs,
                f"forecast peak {peak:g} in the next {p.horizon_s:g} s (error {error:.2f}) "
                f"needs {ahead:.2f}",
                detail,
            )
        settled = reactive.replicas is not None and reactive.replicas < current
        return Recommendation(
            reactive.replicas,
            inputs,
            f"forecast peak {peak:g} in the next {p.horizon_s:g} s needs {ahead:.2f}, no more "
            f"than the present: {reactive.reason}",
            detail,
            settled=settled,
            tolerance=reactive.tolerance,
        )
