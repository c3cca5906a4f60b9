"""A PID loop on the load ratio, with anti-windup and a smoothed output.

The error is ``metric / (ready * target) - 1`` (0 on target, and 0 within ``deadband`` so noise
around the target moves nothing); the output scales the ready count:
``ready * (1 + kp*e + ki*integral + kd*de/dt)``, so kp = 1 alone is HPA's rule. The
integral stops (conditional integration, the usual anti-windup) while replicas are still
starting (their capacity is on its way: integrating that dead time is what makes a loop
overshoot) and while the output is pinned at min or max; it is also bounded by
``integral_limit``. The output is an EWMA (``smoothing`` = weight of the new value).
"""

from __future__ import annotations

from collections.abc import Mapping

from inferway.controllers.autoscale.decision import Recommendation
from inferway.controllers.autoscale.params import Limits, PIDParams
from inferway.controllers.autoscale.samples import SampleWindow, needed_replicas

__all__ = ["PIDRecommender"]


class PIDRecommender:
    name = "pid"

    def __init__(self, metric: str, params: PIDParams, limits: Limits) -> None:
        self._metric = metric
        self._p = params
        self._limits = limits
        self._integral = 0.0
        self._last_error: float | None = None
        self._last_time: float | None = None
        self._output: float | None = None

    def observe(self, _sample: object) -> None:
        """The loop advances on decisions, not on samples."""

    def export_state(self) -> dict[str, float | None]:
        return {
            "integral": self._integral,
            "last_error": self._last_error,
            "last_time": self._last_time,
            "output": self._output,
        }

    def restore_state(self, data: Mapping[str, float | None]) -> None:
        self._integral = float(data["integral"] or 0.0)
        self._last_error, self._last_time = data["last_error"], data["last_time"]
        self._output = data["output"]

    def recommend(
        self, now: float, window: SampleWindow, *, current: int, ready: int
    ) -> Recommendation:
        p = self._p
        value = window.mean(self._metric, now=now, span_s=p.window_s)
        inputs: dict[str, float | None] = {self._metric: value, "target": p.target}
        if value is None:
            return Recommendation(None, inputs, f"no {self._metric} sample: hold")
        base = max(ready, 1)
        error = needed_replicas(self._metric, value, ready=ready, target=p.target) / base - 1.0
        if abs(error) <= p.deadband:
            error = 0.0
        dt = 0.0 if self._last_time is None else max(now - self._last_time, 0.0)
        derivative = 0.0 if self._last_error is None or dt == 0 else (error - self._last_error) / dt
        lim = self._limits
        pinned_high = current >= lim.max_replicas and error > 0
        pinned_low = current <= lim.min_replicas and error < 0
        starting = ready < current and error > 0
        if not (pinned_high or pinned_low or starting):
            bound = p.integral_limit
            self._integral = min(max(self._integral + error * dt, -bound), bound)
        u = p.kp * error + p.ki * self._integral + p.kd * derivative
        raw = base * (1.0 + u)
        smoothed = (
            raw if self._output is None else self._output + p.smoothing * (raw - self._output)
        )
        self._output = smoothed
        self._last_error, self._last_time = error, now
        detail = {
            "error": error,
            "p": p.kp * error,
            "i": p.ki * self._integral,
            "d": p.kd * derivative,
            "raw_output": raw,
            "integrating": not (pinned_high or pinned_low or starting),
        }
        return Recommendation(
            max(smoothed, 0.0),
            inputs,
            f"error {error:+.2f} (p {detail['p']:+.2f}, i {detail['i']:+.2f}, "
            f"d {detail['d']:+.2f}) -> {smoothed:.2f}",
            detail,
        )
