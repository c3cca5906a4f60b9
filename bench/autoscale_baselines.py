"""The baselines of bench/autoscale_sim.py, each from its documented algorithm, and the
adapter that drives inferway's own Autoscaler in the same harness.

* Kubernetes HPA (autoscaling/v2, kubernetes.io "Horizontal Pod Autoscaling"): every 15 s,
  ``desired = ceil(current * metric / target)`` on the per-pod mean of the last 15 s, skipped
  within tolerance 0.1; pods not yet ready count as 0 when scaling up (the docs' conservative
  rebalancing); default behaviour: scale up by max(100%, 4 pods) per 15 s, no up
  stabilization, scale down to the highest recommendation of the last 300 s, 100% per 15 s.
* Knative KPA (knative.dev "Autoscaling concepts" and pkg/autoscaler/scaling/autoscaler.go):
  every 2 s, ``ceil(window mean / (target * utilization))`` on a 60 s stable window and a 6 s
  panic window; panic when the panic window asks for >= 200% of the ready pods, then never
  scale down until 60 s pass without panic; scale up at most 1000x, down at most 2x a tick.
  Its metric here is ``rps`` (a documented KPA metric) at the shared target, so all the
  controllers aim for the same per-replica load.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

from inferway.controllers.autoscale.autoscaler import Autoscaler
from inferway.controllers.autoscale.params import AutoscaleConfig
from inferway.controllers.autoscale.samples import MetricSample

__all__ = ["HPA", "KPA", "Controller", "InferwayController"]


class Controller(Protocol):
    name: str
    period_s: float

    def observe(self, sample: MetricSample) -> None: ...

    def decide(self, now: float, *, current: int, ready: int) -> int: ...


class _RateWindow:
    """Per-second request rates of the last ``span`` seconds."""

    def __init__(self, span: int) -> None:
        self._values: deque[float] = deque(maxlen=span)

    def add(self, value: float) -> None:
        self._values.append(value)

    def mean(self, last: int) -> float:
        values = list(self._values)[-last:]
        return sum(values) / len(values) if values else 0.0


class HPA:
    name = "k8s-hpa"
    period_s = 15.0

    def __init__(self, *, target: float, min_replicas: int, max_replicas: int) -> None:
        self._target = target
        self._min, self._max = min_replicas, max_replicas
        self._rates = _RateWindow(15)
        self._recommendations: deque[tuple[float, int]] = deque()

    def observe(self, sample: MetricSample) -> None:
        self._rates.add(sample.request_rate or 0.0)

    def decide(self, now: float, *, current: int, ready: int) -> int:
        total = self._rates.mean(15)
        ratio = total / max(ready, 1) / self._target
        if ratio > 1.0 and current > ready:
            ratio = total / max(current, 1) / self._target  # unready pods count as 0
        within = abs(ratio - 1.0) <= 0.1
        recommendation = current if within else math.ceil(current * ratio - 1e-9)
        recommendation = min(max(recommendation, self._min), self._max)
        self._recommendations.append((now, recommendation))
        while self._recommendations[0][0] < now - 300:
            self._recommendations.popleft()
        if recommendation < current:
            desired = min(current, max(v for _, v in self._recommendations))
        else:
            desired = min(recommendation, max(current * 2, current + 4))
        return min(max(desired, self._min), self._max)


class KPA:
    name = "knative-kpa"
    period_s = 2.0

    def __init__(
        self, *, target: float, min_replicas: int, max_replicas: int, utilization: float = 0.7
    ) -> None:
        self._per_pod = target  # target * utilization: the shared per-replica target
        self._min, self._max = min_replicas, max_replicas
        self._utilization = utilization
        self._rates = _RateWindow(60)
        self._panic_since: float | None = None
        self._max_panic_pods = 0

    def observe(self, sample: MetricSample) -> None:
        self._rates.add(sample.request_rate or 0.0)

    def decide(self, now: float, *, current: int, ready: int) -> int:
        ready_pods = max(ready, 1)
        up_limit = math.ceil(1000.0 * ready_pods)
        down_limit = math.floor(ready_pods / 2.0)
        stable = math.ceil(self._rates.mean(60) / self._per_pod - 1e-9)
        panic = math.ceil(self._rates.mean(6) / self._per_pod - 1e-9)
        stable = min(max(stable, down_limit), up_limit)
        panic = min(max(panic, down_limit), up_limit)
        over = panic / ready_pods >= 2.0
        if over:
            self._panic_since = now
        elif self._panic_since is not None and now > self._panic_since + 60.0:
            self._panic_since = None
            self._max_panic_pods = 0
        if self._panic_since is not None:
            desired = max(panic, self._max_panic_pods, current)
            self._max_panic_pods = desired
        else:
            desired = stable
        return min(max(desired, self._min), self._max)


class InferwayController:
    """Feeds inferway's Autoscaler one sample per sampling interval (the interval's mean
    rate; queue, in-flight and p99 as last scraped) and decides as often."""

    def __init__(self, name: str, config: AutoscaleConfig) -> None:
        self.name = name
        self.period_s = config.sampling_interval_s
        self.autoscaler = Autoscaler(config)
        self._rates: list[float] = []
        self._p99 = 0.0
        self._last: MetricSample | None = None
        self.decisions = 0

    def observe(self, sample: MetricSample) -> None:
        self._rates.append(sample.request_rate or 0.0)
        self._p99 = max(self._p99, sample.p99_latency or 0.0)
        self._last = sample

    def decide(self, now: float, *, current: int, ready: int) -> int:
        last = self._last
        if last is not None and self._rates:
            self.autoscaler.observe(
                MetricSample(
                    time=now,
                    queue_length=last.queue_length,
                    in_flight=last.in_flight,
                    request_rate=sum(self._rates) / len(self._rates),
                    p99_latency=self._p99,
                    utilization=last.utilization,
                )
            )
        self._rates, self._p99 = [], 0.0
        self.decisions += 1
        return self.autoscaler.decide(now, current=current, ready=ready).desired
