"""One service's autoscaler: samples in, an explained Decision out, on the caller's clock.

It assumes each decision it returns is acted on (the actuator scales to ``desired``): the
cooldowns and the stabilization history count from the decisions it made. The caller reports
``current`` (replicas asked for, starting ones included) and ``ready`` (serving) each time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from inferway.controllers.autoscale.decision import Decision, Recommendation, whole_replicas
from inferway.controllers.autoscale.limits import Governor
from inferway.controllers.autoscale.params import (
    AutoscaleConfig,
    PIDParams,
    PredictiveParams,
    ProportionalParams,
    ThresholdParams,
)
from inferway.controllers.autoscale.pid import PIDRecommender
from inferway.controllers.autoscale.predictive import PredictiveRecommender
from inferway.controllers.autoscale.reactive import (
    ProportionalRecommender,
    ThresholdRecommender,
)
from inferway.controllers.autoscale.samples import (
    MetricSample,
    SampleWindow,
    needed_replicas,
)

__all__ = ["Autoscaler", "Recommender", "build_recommender"]


class Recommender(Protocol):
    name: str

    def observe(self, sample: MetricSample) -> None: ...

    def recommend(
        self, now: float, window: SampleWindow, *, current: int, ready: int
    ) -> Recommendation: ...


def build_recommender(config: AutoscaleConfig) -> Recommender:
    p = config.params
    if isinstance(p, ThresholdParams):
        return ThresholdRecommender(config.metric, p, config.sampling_interval_s)
    if isinstance(p, PIDParams):
        return PIDRecommender(config.metric, p, config.limits)
    if isinstance(p, PredictiveParams):
        return PredictiveRecommender(config.metric, p)
    return ProportionalRecommender(config.metric, p)


def _target(config: AutoscaleConfig) -> float | None:
    p = config.params
    if isinstance(p, PredictiveParams):
        return p.reactive.target
    if isinstance(p, ProportionalParams | PIDParams):
        return p.target
    return None


def _window_span(config: AutoscaleConfig) -> float:
    p = config.params
    spans = [config.sampling_interval_s, config.panic.window_s]
    if isinstance(p, ProportionalParams | PIDParams):
        spans.append(p.window_s)
    if isinstance(p, PredictiveParams):
        spans.append(p.reactive.window_s)
    return 2 * max(spans)


class Autoscaler:
    def __init__(self, config: AutoscaleConfig) -> None:
        self.config = config
        self._window = SampleWindow(_window_span(config))
        self._recommender = build_recommender(config)
        self._governor = Governor(config.limits, config.panic)
        self._target = _target(config)
        self.last_decision: Decision | None = None

    def observe(self, sample: MetricSample) -> None:
        """Record one scrape (in time order)."""
        self._window.add(sample)
        self._recommender.observe(sample)

    def export_state(self) -> dict[str, Any]:
        """Everything the next decision depends on, as JSON: the samples of the window, the
        clamps' memory (stabilization, cooldowns, panic), a PID's terms and the last
        decision. Times are the caller's clock: on a fleet, wall-clock seconds."""
        pid = self._recommender
        return {
            "samples": [s.to_json() for s in self._window],
            "governor": self._governor.export_state(),
            "pid": pid.export_state() if isinstance(pid, PIDRecommender) else None,
            "last_decision": None if self.last_decision is None else self.last_decision.to_dict(),
        }

    def restore_state(self, data: Mapping[str, Any]) -> None:
        """Continue from another replica's :meth:`export_state` (same config). The samples
        are observed again, so a recommender that learns from samples (the predictive one's
        forecast) relearns from the window it is handed, no further back."""
        self._window = SampleWindow(self._window.span_s)
        self._recommender = build_recommender(self.config)
        for row in data["samples"]:
            self.observe(MetricSample.from_json(row))
        self._governor.restore_state(data["governor"])
        if isinstance(self._recommender, PIDRecommender) and data.get("pid") is not None:
            self._recommender.restore_state(data["pid"])
        last = data.get("last_decision")
        self.last_decision = None if last is None else Decision.from_dict(last)

    def decide(self, now: float, *, current: int, ready: int) -> Decision:
        if current < 0 or ready < 0:
            raise ValueError(f"replica counts must be >= 0, got current={current} ready={ready}")
        cfg = self.config
        rec = self._recommender.recommend(now, self._window, current=current, ready=ready)
        raw = rec.replicas
        recommended = current if raw is None else whole_replicas(raw, rec.tolerance)
        panic_needed = None
        inputs = dict(rec.inputs)
        if cfg.panic.enabled and self._target is not None:
            short = self._window.mean(cfg.metric, now=now, span_s=cfg.panic.window_s)
            if short is not None:
                inputs[f"{cfg.metric}_panic_window"] = short
                # the same band as the recommendation: a short-window rate 0.15% above 3
                # replicas' worth is 3 replicas, not a panic to 4 (issue 33, item 11)
                panic_needed = whole_replicas(
                    needed_replicas(cfg.metric, short, ready=ready, target=self._target),
                    rec.tolerance,
                )
        desired, clamps, panic = self._governor.apply(
            now,
            recommended,
            current=current,
            ready=ready,
            panic_needed=panic_needed,
            settled=rec.settled,
        )
        reason = f"{rec.reason} -> {recommended}"
        for c in clamps:
            reason += f"; {c.name} {c.before}->{c.after} ({c.detail})"
        verb = {True: "scale out", False: "scale in"}.get(desired > current, "")
        reason += f"; {verb} {current}->{desired}" if desired != current else f"; hold {current}"
        decision = Decision(
            service=cfg.service,
            time=now,
            algorithm=cfg.algorithm,
            metric=cfg.metric,
            current=current,
            ready=ready,
            inputs=inputs,
            raw=rec.replicas,
            recommended=recommended,
            desired=desired,
            clamps=clamps,
            panic=panic,
            detail=rec.detail,
            reason=reason,
        )
        self.last_decision = decision
        return decision
