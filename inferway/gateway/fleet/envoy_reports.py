"""Evidence from every Envoy: the OTLP metrics each Envoy pushes, kept per node, and the
rollout windows read from the fleet's totals.

Each Envoy's stat sink sends ``x-inferway-node`` (its node id) and ``x-inferway-zone`` as gRPC
metadata, written into its bootstrap; the receiver keeps each node's latest totals and when
they came. :class:`FleetStatsSource` answers the rollout driver like the one-Envoy source does,
a window at a time, but a window is the sum of every node's own difference since the previous
window (so one Envoy restarting resets only its own share), and it says who contributed what
and which Envoys went silent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as otlp
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
    MetricsServiceServicer,
    add_MetricsServiceServicer_to_server,
)

from inferway.controllers.rollout.evidence import VersionCounts, WindowSample
from inferway.gateway.fleet.otlp_totals import totals_from_export
from inferway.gateway.rollouts.envoy_stats import ClusterTotals, ScrapeError, window_counts
from inferway.xds.bootstrap import STATS_NODE_HEADER, STATS_ZONE_HEADER

__all__ = [
    "NODE_HEADER",
    "ZONE_HEADER",
    "EnvoyReports",
    "FleetStatsSource",
    "FleetWindow",
    "NewestReports",
    "NodeReport",
    "ReportView",
]

log = logging.getLogger("inferway.fleet")

NODE_HEADER = STATS_NODE_HEADER
ZONE_HEADER = STATS_ZONE_HEADER


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One Envoy's latest totals (every cluster it reported) and when they arrived."""

    node: str
    zone: str
    at: float
    totals: Mapping[str, ClusterTotals]


class ReportView(Protocol):
    """Where a fleet source reads the nodes' latest reports (this replica's receiver, or the
    store's copy of every replica's)."""

    def reports(self) -> dict[str, NodeReport]: ...


class NewestReports:
    """Each node's newest report among several views: the leader reads the store's copy of
    every replica's reports and its own receiver, which has its Envoys' reports a publish
    round (seconds, with 1,000 Envoys) before the store does."""

    def __init__(self, *views: ReportView) -> None:
        self.views = views

    def reports(self) -> dict[str, NodeReport]:
        newest: dict[str, NodeReport] = {}
        for view in self.views:
            for node, report in view.reports().items():
                known = newest.get(node)
                if known is None or report.at > known.at:
                    newest[node] = report
        return newest


class EnvoyReports(MetricsServiceServicer):
    """The OTLP metrics receiver: ``Export`` keeps the latest report of each node (times are
    wall-clock seconds: replicas compare them)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._latest: dict[str, NodeReport] = {}
        self.exports = 0
        self.refused = 0

    async def Export(
        self, request: otlp.ExportMetricsServiceRequest, context: grpc.aio.ServicerContext
    ) -> otlp.ExportMetricsServiceResponse:
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        node = metadata.get(NODE_HEADER, "")
        if not node:
            self.refused += 1
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"an Envoy's stats export needs its node id in the {NODE_HEADER} header",
            )
        self.record(node, metadata.get(ZONE_HEADER, ""), request)
        return otlp.ExportMetricsServiceResponse()

    def record(self, node: str, zone: str, request: otlp.ExportMetricsServiceRequest) -> None:
        totals = totals_from_export(request)
        previous = self._latest.get(node)
        if previous is not None:
            # an export lists the clusters whose stats changed or exist; keep the others
            totals = {**previous.totals, **totals}
        self._latest[node] = NodeReport(node, zone, self._clock(), totals)
        self.exports += 1

    def register(self, server: grpc.aio.Server) -> None:
        """Serve ``Export`` on ``server`` (the xDS server: Envoy pushes on its xDS cluster)."""
        add_MetricsServiceServicer_to_server(self, server)

    def reports(self) -> dict[str, NodeReport]:
        return dict(self._latest)

    def forget(self, node: str) -> None:
        self._latest.pop(node, None)


@dataclass(frozen=True, slots=True)
class FleetWindow:
    """One window of the fleet's evidence: the sum, each node's share, and who is silent."""

    sample: WindowSample
    by_node: Mapping[str, WindowSample]
    silent: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        def counts(c: VersionCounts) -> dict[str, int]:
            return {"requests": c.requests, "errors": c.errors}

        return {
            "contributors": {
                node: {"stable": counts(s.stable), "canary": counts(s.canary)}
                for node, s in sorted(self.by_node.items())
            },
            "silent": list(self.silent),
        }


@dataclass
class FleetStatsSource:
    """The rollout's evidence from every Envoy's pushed stats. ``silent_after_s``: a node
    whose last report is older is silent (its share is missing from the window, and said so).
    The first sample is the baseline (None), like the one-Envoy source."""

    reports: ReportView
    stable: str
    canary: str
    silent_after_s: float = 5.0
    clock: Callable[[], float] = time.time
    _last: dict[str, Mapping[str, ClusterTotals]] | None = None
    last_window: FleetWindow | None = field(default=None, init=False)

    async def sample(self) -> WindowSample | None:
        reports = self.reports.reports()
        if not reports:
            raise ScrapeError("no Envoy has reported its stats to the control plane yet")
        now = self.clock()
        live = {n: r for n, r in reports.items() if now - r.at <= self.silent_after_s}
        silent = tuple(sorted(set(reports) - set(live)))
        if not live:
            raise ScrapeError(f"every Envoy is silent: {', '.join(silent)}")
        current = {node: report.totals for node, report in live.items()}
        before, self._last = self._last, {**(self._last or {}), **current}
        if before is None:
            return None
        by_node: dict[str, WindowSample] = {}
        for node, totals in current.items():
            previous = before.get(node)
            by_node[node] = WindowSample(
                stable=window_counts(
                    previous.get(self.stable) if previous else None,
                    totals.get(self.stable, ClusterTotals()),
                ),
                canary=window_counts(
                    previous.get(self.canary) if previous else None,
                    totals.get(self.canary, ClusterTotals()),
                ),
            )
        total = WindowSample(VersionCounts(), VersionCounts())
        for share in by_node.values():
            total = total.plus(share)
        self.last_window = FleetWindow(total, by_node, silent)
        if silent:
            log.warning("rollout evidence without silent Envoys: %s", ", ".join(silent))
        return total
