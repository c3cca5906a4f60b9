"""The two reactive algorithms: the issue's threshold rule and HPA's proportional rule."""

from __future__ import annotations

from inferway.controllers.autoscale.decision import Recommendation
from inferway.controllers.autoscale.params import ProportionalParams, ThresholdParams
from inferway.controllers.autoscale.samples import SampleWindow, needed_replicas

__all__ = ["ProportionalRecommender", "ThresholdRecommender"]


class ThresholdRecommender:
    """Above the threshold add ``step`` replicas; below ``scale_in_threshold`` remove them."""

    name = "threshold"

    def __init__(self, metric: str, params: ThresholdParams, interval_s: float) -> None:
        self._metric = metric
        self._p = params
        self._interval = interval_s

    def observe(self, _sample: object) -> None:
        """Stateless: it reads the window."""

    def recommend(
        self, now: float, window: SampleWindow, *, current: int, ready: int
    ) -> Recommendation:
        p = self._p
        value = window.mean(self._metric, now=now, span_s=self._interval)
        inputs = {self._metric: value}
        if value is None:
            return Recommendation(None, inputs, f"no {self._metric} sample: hold")
        if value > p.threshold:
            return Recommendation(
                current + p.step,
                inputs,
                f"{self._metric} {value:g} > threshold {p.threshold:g}: add {p.step}",
            )
        if p.scale_in_threshold is not None and value < p.scale_in_threshold:
            return Recommendation(
                current - p.step,
                inputs,
                f"{self._metric} {value:g} < scale-in threshold {p.scale_in_threshold:g}: "
                f"remove {p.step}",
            )
        return Recommendation(current, inputs, f"{self._metric} {value:g} within thresholds")


class ProportionalRecommender:
    """``replicas = metric / target`` on a window mean, held within the tolerance of current.

    With ``backlog_drain_s`` on a request-rate metric the queue counts as extra rate
    (``queue / backlog_drain_s``): a backlog built during a spike is drained, not just held.
    """

    name = "proportional"

    def __init__(self, metric: str, params: ProportionalParams) -> None:
        self._metric = metric
        self._p = params

    def observe(self, _sample: object) -> None:
        """Stateless: it reads the window."""

    def recommend(
        self, now: float, window: SampleWindow, *, current: int, ready: int
    ) -> Recommendation:
        p = self._p
        value = window.mean(self._metric, now=now, span_s=p.window_s)
        inputs: dict[str, float | None] = {self._metric: value, "target": p.target}
        if value is None:
            return Recommendation(None, inputs, f"no {self._metric} sample: hold")
        needed = needed_replicas(self._metric, value, ready=ready, target=p.target)
        why = f"{self._metric} {value:g} / target {p.target:g} per replica = {needed:.2f}"
        latest = window.latest
        if p.backlog_drain_s is not None and latest is not None:
            queue = latest.value("queue_length") or 0.0
            inputs["queue_length"] = queue
            if queue > 0:
                extra = queue / p.backlog_drain_s / p.target
                needed += extra
                why += f" + {extra:.2f} to drain a queue of {queue:g} in {p.backlog_drain_s:g} s"
        up_band = p.tolerance_up
        if current > 0:
            ratio = needed / current
            tolerance = p.tolerance_up if ratio > 1.0 else p.tolerance_down
            p99 = latest.value("p99_latency") if latest is not None else None
            if ratio > 1.0 and p.latency_guard_s is not None and p99 is not None:
                inputs["p99_latency"] = p99
                if p99 >= p.latency_guard_s:
                    tolerance = up_band = 0.0
                    why += f"; p99 {p99 * 1000:.0f} ms >= guard {p.latency_guard_s * 1000:.0f} ms"
            if abs(ratio - 1.0) <= tolerance:
                return Recommendation(
                    current,
                    inputs,
                    f"{why}: within tolerance {tolerance:g} of {current}",
                    tolerance=up_band,
                )
        return Recommendation(needed, inputs, why, tolerance=up_band)
