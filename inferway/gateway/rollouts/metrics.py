"""Prometheus metrics of the rollouts, on the control plane's registry: gauges read from the
driver at scrape time (so a scrape never shows a stale weight), counters fed by its
decision hook."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferway.controllers.rollout.state import Decision, Phase
from inferway.gateway.rollouts.driver import RolloutDriver

__all__ = ["RolloutMetrics"]


class _Gauges(Collector):
    def __init__(self, driver: RolloutDriver) -> None:
        self._driver = driver

    def collect(self) -> Iterator[Metric]:
        weight = GaugeMetricFamily(
            "inferway_rollout_weight",
            "The canary's share of its route in percent (stable has the rest).",
            labels=["rollout", "canary"],
        )
        step = GaugeMetricFamily(
            "inferway_rollout_step", "The step the rollout holds (0-based).", labels=["rollout"]
        )
        phase = GaugeMetricFamily(
            "inferway_rollout_phase",
            "1 for the rollout's phase, 0 for the others.",
            labels=["rollout", "phase"],
        )
        for name in self._driver.names():
            status = self._driver.status(name, history=0)
            weight.add_metric([name, status["canary"]], status["weight_percent"])
            step.add_metric([name], float(status["step"]))
            for p in Phase:
                phase.add_metric([name, p.value], 1.0 if p.value == status["phase"] else 0.0)
        yield weight
        yield step
        yield phase

    def describe(self) -> Iterator[Metric]:
        return iter(())


class RolloutMetrics:
    """``attach`` registers the gauges and hooks the counters onto ``driver``."""

    def __init__(self, registry: CollectorRegistry, driver: RolloutDriver) -> None:
        self.verdicts = Counter(
            "inferway_rollout_verdicts",
            "Analysis verdicts, by rollout, check and result (pass, fail, need_more).",
            ["rollout", "check", "result"],
            registry=registry,
        )
        self.decisions = Counter(
            "inferway_rollout_decisions",
            "Rollout decisions, by rollout and action (advance, promote, rollback, hold, ...).",
            ["rollout", "action"],
            registry=registry,
        )
        registry.register(_Gauges(driver))

    @classmethod
    def attach(cls, registry: CollectorRegistry, driver: RolloutDriver) -> RolloutMetrics:
        metrics = cls(registry, driver)
        driver.add_hook(metrics.on_decision)
        return metrics

    def on_decision(self, rollout: str, decision: Decision) -> None:
        self.decisions.labels(rollout, decision.action).inc()
        for verdict in decision.verdicts:
            self.verdicts.labels(rollout, verdict.check, verdict.result).inc()
