"""The autoscaler's input on a fleet: a service's load summed over every Envoy that reports,
not the one Envoy on the control plane's loopback.

Each Envoy pushes its stats (OTLP) to whichever replica it is connected to; the replicas copy
the latest report of each node into the store (``evidence/<node>``), and the leader reads all
of them (:class:`~inferway.gateway.fleet.shared_evidence.StoreEvidence`). A sample is built as
the one-Envoy path builds it from ``/stats/prometheus``, as a :class:`ClusterLoad` of running
totals, so :func:`~inferway.gateway.autoscale_inputs.build_sample` turns two of them into a
rate: here the fleet's running totals advance by each node's own difference since the previous
sample (a restarted Envoy counts from zero, an Envoy that went silent adds nothing and is
named, a new one starts from its first report), so no node's reset or departure can make the
fleet's total go down. In flight is the sum over the reporting Envoys; healthy hosts the most
any of them holds healthy (they share one endpoint list). Each sample says which Envoys
contributed what, for the decision's record. Pure: the reports and the clock are given.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferway.gateway.autoscale_inputs import ClusterLoad, StatsError
from inferway.gateway.fleet.envoy_reports import ReportView
from inferway.gateway.rollouts.envoy_stats import ClusterTotals

__all__ = ["FleetLoad", "FleetLoadSource"]


@dataclass(frozen=True)
class FleetLoad:
    """One service at one sample: the fleet's running totals, who contributed, who is silent."""

    load: ClusterLoad
    contributors: Mapping[str, dict[str, int]]
    """Node -> its requests since the previous sample and in flight now."""
    silent: tuple[str, ...]
    rate: float | None = None
    """Requests per second: each node's new requests over the time between its own two
    reports, summed (None on the first sample). Exact to the count, whatever the phase of
    the pushes against the sampling ticks, which a difference over the ticks is not (a 2 s
    tick over 0.5 s pushes would read 25% off by chance)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "contributors": {n: dict(c) for n, c in sorted(self.contributors.items())},
            "silent": list(self.silent),
        }


def _went_down(now: ClusterTotals, before: ClusterTotals) -> bool:
    if now.requests < before.requests:
        return True
    return any(now.buckets.get(le, 0) < n for le, n in before.buckets.items())


@dataclass
class _Service:
    """The fleet's running totals of one service, and each node's totals at the last sample."""

    requests: int = 0
    buckets: dict[float, int] = field(default_factory=dict)
    nodes: dict[str, ClusterTotals] = field(default_factory=dict)
    at: dict[str, float] = field(default_factory=dict)
    """Node -> when the report of its ``nodes`` totals was made."""
    rates: dict[str, float] = field(default_factory=dict)
    """Node -> its rate between its last two reports (kept while no new report came)."""


class FleetLoadSource:
    """``load(service)`` per sample; ``silent_after_s``: a node whose last report is older is
    left out of the sample and named."""

    def __init__(
        self,
        reports: ReportView,
        *,
        silent_after_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.reports = reports
        self.silent_after_s = silent_after_s
        self._clock = clock
        self._services: dict[str, _Service] = {}

    def load(self, service: str) -> FleetLoad:
        reports = self.reports.reports()
        if not reports:
            raise StatsError("no Envoy has reported its stats to the control plane yet")
        now = self._clock()
        live = {n: r for n, r in reports.items() if now - r.at <= self.silent_after_s}
        silent = tuple(sorted(set(reports) - set(live)))
        if not live:
            raise StatsError(f"every Envoy is silent: {', '.join(silent)}")
        state = self._services.setdefault(service, _Service())
        contributors: dict[str, dict[str, int]] = {}
        active = 0
        healthy: int | None = None
        rate: float | None = 0.0 if state.nodes else None
        for node, report in sorted(live.items()):
            totals = report.totals.get(service, ClusterTotals())
            before = state.nodes.get(node)
            then = state.at.get(node)
            if before is None:
                # a node's first sample is its baseline: what it counted before is not this
                # interval's (unless the fleet itself is new, then nothing is)
                base = totals
            elif _went_down(totals, before):
                base = ClusterTotals()
            else:
                base = before
            added = max(totals.requests - base.requests, 0)
            state.requests += added
            for le, n in totals.buckets.items():
                state.buckets[le] = state.buckets.get(le, 0) + max(n - base.buckets.get(le, 0), 0)
            if then is not None and report.at > then:
                state.rates[node] = added / (report.at - then)
            if rate is not None:
                rate += state.rates.get(node, 0.0)
            state.nodes[node], state.at[node] = totals, report.at
            active += totals.active
            if totals.healthy is not None:
                healthy = max(healthy or 0, totals.healthy)
            contributors[node] = {"requests": added, "in_flight": totals.active}
        load = ClusterLoad(state.requests, active, dict(state.buckets), healthy)
        return FleetLoad(load, contributors, silent, rate)

    # -- a new leader continues where the last one was --------------------------------------

    def export_state(self, service: str) -> dict[str, Any] | None:
        """The service's running totals and each node's baseline, as JSON (for the store)."""
        state = self._services.get(service)
        if state is None:
            return None
        return {
            "requests": state.requests,
            "buckets": _buckets_json(state.buckets),
            "nodes": {
                node: {
                    "requests": t.requests,
                    "buckets": _buckets_json(t.buckets),
                    "at": state.at.get(node),
                    "rate": state.rates.get(node),
                }
                for node, t in sorted(state.nodes.items())
            },
        }

    def restore_state(self, service: str, data: Mapping[str, Any]) -> None:
        """Continue from a state another replica exported: the next sample's difference is
        taken from the nodes' totals it last saw, so no request is counted twice or lost."""
        rows = data["nodes"]
        self._services[service] = _Service(
            int(data["requests"]),
            _buckets(data["buckets"]),
            {
                n: ClusterTotals(int(t["requests"]), 0, _buckets(t["buckets"]))
                for n, t in rows.items()
            },
            {n: float(t["at"]) for n, t in rows.items() if t.get("at") is not None},
            {n: float(t["rate"]) for n, t in rows.items() if t.get("rate") is not None},
        )


def _buckets_json(buckets: Mapping[float, int]) -> list[list[Any]]:
    return [[str(le), n] for le, n in sorted(buckets.items())]


def _buckets(rows: list[list[Any]]) -> dict[float, int]:
    return {float(le): int(n) for le, n in rows}
