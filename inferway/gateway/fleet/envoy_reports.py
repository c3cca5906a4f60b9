"""Evidence from every Envoy: the OTLP metrics each Envoy pushes, kept per node, and the
rollout windows read from the fleet's totals.

Each Envoy's stat sink sends ``x-inferway-node`` (its node id) and ``x-inferway-zone`` as gRPC
metadata, written into its bootstrap; the receiver keeps each node's latest totals and when
they came. When the xDS server requires client certificates (``verify_identity``), the node an
export names must be an identity of the certificate of the connection it came on, the rule the
ADS stream follows (``inferway.xds.auth``): otherwise one Envoy could report (or drown out)
another's evidence. A mismatch is refused with ``PERMISSION_DENIED``, counted
(``refused_identity``) and recorded with the xDS server's refusals (``inferway status``).
:class:`FleetStatsSource` answers the rollout driver like the one-Envoy source does,
a window at a time, but a window is the sum of every node's own difference since the previous
window (so one Envoy restarting resets only its own share), and it says who contributed what
and which Envoys went silent.

A report expires ``EVIDENCE_TTL_S`` after it arrived: an Envoy gone for good (scaled away,
its host lost) stops counting anywhere and is listed as *gone* instead of silent forever;
it counts again from its next report. Gone nodes are forgotten after ``FORGET_AFTER_TTLS``
TTLs, so a fleet whose Envoys come and go (new node ids each time) does not grow without end.
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
from inferway.gateway.fleet.otlp_totals import limiter_totals_from_export, totals_from_export
from inferway.gateway.rollouts.envoy_stats import ClusterTotals, ScrapeError, window_counts
from inferway.xds.auth import PeerRefusals, check_node_identity, peer_identities
from inferway.xds.bootstrap import STATS_NODE_HEADER, STATS_ZONE_HEADER

__all__ = [
    "EVIDENCE_TTL_S",
    "FORGET_AFTER_TTLS",
    "LIMITER_KEY",
    "NODE_HEADER",
    "ZONE_HEADER",
    "EnvoyReports",
    "FleetStatsSource",
    "FleetWindow",
    "NewestReports",
    "NodeReport",
    "ReportView",
    "ReportsByAge",
]

log = logging.getLogger("inferway.fleet")

NODE_HEADER = STATS_NODE_HEADER
LIMITER_KEY = "ratelimit:"
"""``totals[LIMITER_KEY + route]``: a route limiter's (offered, refused) as (requests, errors);
no cluster is named so (a service name has no colon)."""
ZONE_HEADER = STATS_ZONE_HEADER
EVIDENCE_TTL_S = 60.0
"""A node's report counts for this long after it arrived (Envoys push every 2 s by default;
a minute covers a restart, a reconnect to another replica and a slow store)."""
FORGET_AFTER_TTLS = 10


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

    def reports(self) -> dict[str, NodeReport]:
        """Every node whose latest report has not expired."""
        ...

    def expired(self) -> dict[str, NodeReport]:
        """Nodes whose latest report is older than the evidence TTL (gone: not counted)."""
        ...


class ReportsByAge:
    """The latest report of each node, split by age: live ones count, expired ones are
    flagged (logged once each time a node goes) and dropped after ``FORGET_AFTER_TTLS``."""

    def __init__(self, clock: Callable[[], float], expire_after_s: float) -> None:
        if expire_after_s <= 0:
            raise ValueError(f"expire_after_s must be positive, got {expire_after_s}")
        self.clock, self.expire_after_s = clock, expire_after_s
        self.latest: dict[str, NodeReport] = {}
        self._flagged: set[str] = set()

    def put(self, report: NodeReport) -> None:
        self.latest[report.node] = report
        self._flagged.discard(report.node)

    def _split(self) -> tuple[dict[str, NodeReport], dict[str, NodeReport]]:
        now = self.clock()
        forget = now - FORGET_AFTER_TTLS * self.expire_after_s
        for node in [n for n, r in self.latest.items() if r.at < forget]:
            del self.latest[node]
            self._flagged.discard(node)
        live: dict[str, NodeReport] = {}
        gone: dict[str, NodeReport] = {}
        for node, report in self.latest.items():
            (live if now - report.at <= self.expire_after_s else gone)[node] = report
        for node in sorted(set(gone) - self._flagged):
            self._flagged.add(node)
            log.warning(
                "Envoy %s (zone %r) has not reported for %.0f s, over the %.0f s evidence "
                "TTL: its evidence no longer counts; listed as gone",
                node,
                gone[node].zone,
                now - gone[node].at,
                self.expire_after_s,
            )
        return live, gone

    def reports(self) -> dict[str, NodeReport]:
        return self._split()[0]

    def expired(self) -> dict[str, NodeReport]:
        return self._split()[1]


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

    def expired(self) -> dict[str, NodeReport]:
        """Nodes gone in every view that knows them (live in one view: not gone)."""
        live = self.reports()
        gone: dict[str, NodeReport] = {}
        for view in self.views:
            for node, report in view.expired().items():
                known = gone.get(node)
                if node not in live and (known is None or report.at > known.at):
                    gone[node] = report
        return gone


class EnvoyReports(MetricsServiceServicer):
    """The OTLP metrics receiver: ``Export`` keeps the latest report of each node (times are
    wall-clock seconds: replicas compare them)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        expire_after_s: float = EVIDENCE_TTL_S,
        *,
        verify_identity: bool = False,
        refusals: PeerRefusals | None = None,
    ) -> None:
        """``verify_identity``: the server is mutual TLS and a node must be its certificate's
        identity; ``refusals``: where refused exports are recorded (the xDS server's)."""
        self._clock = clock
        self._by_age = ReportsByAge(clock, expire_after_s)
        self.verify_identity = verify_identity
        self.refusals = refusals if refusals is not None else PeerRefusals()
        self.exports = 0
        self.refused = 0
        self.refused_identity = 0

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
        if self.verify_identity:
            identities = peer_identities(context.auth_context())
            if not check_node_identity(node, identities):
                self.refused += 1
                self.refused_identity += 1
                reason = (
                    f"stats export for node {node!r} refused: not an identity of the client "
                    f"certificate ({', '.join(identities) or 'no certificate'})"
                )
                self.refusals.record(node, context.peer(), identities, reason)
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)
        self.record(node, metadata.get(ZONE_HEADER, ""), request)
        return otlp.ExportMetricsServiceResponse()

    def record(self, node: str, zone: str, request: otlp.ExportMetricsServiceRequest) -> None:
        totals = totals_from_export(request)
        for route, (offered, refused) in limiter_totals_from_export(request).items():
            # a route limiter's counters ride with the clusters' (a fleet-wide limit's split)
            totals[LIMITER_KEY + route] = ClusterTotals(offered, refused)
        previous = self._by_age.latest.get(node)
        if previous is not None:
            # an export lists the clusters whose stats changed or exist; keep the others
            totals = {**previous.totals, **totals}
        self._by_age.put(NodeReport(node, zone, self._clock(), totals))
        self.exports += 1

    def register(self, server: grpc.aio.Server) -> None:
        """Serve ``Export`` on ``server`` (the xDS server: Envoy pushes on its xDS cluster)."""
        add_MetricsServiceServicer_to_server(self, server)

    def reports(self) -> dict[str, NodeReport]:
        return self._by_age.reports()

    def expired(self) -> dict[str, NodeReport]:
        return self._by_age.expired()

    def forget(self, node: str) -> None:
        self._by_age.latest.pop(node, None)


@dataclass(frozen=True, slots=True)
class FleetWindow:
    """One window of the fleet's evidence: the sum, each node's share, who is silent (late,
    left out of this window) and who is gone (past the evidence TTL, not counted at all)."""

    sample: WindowSample
    by_node: Mapping[str, WindowSample]
    silent: tuple[str, ...]
    gone: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        def counts(c: VersionCounts) -> dict[str, int]:
            return {"requests": c.requests, "errors": c.errors}

        return {
            "contributors": {
                node: {"stable": counts(s.stable), "canary": counts(s.canary)}
                for node, s in sorted(self.by_node.items())
            },
            "silent": list(self.silent),
            "gone": list(self.gone),
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
        gone = tuple(sorted(self.reports.expired()))
        if not reports:
            if gone:
                raise ScrapeError(f"every Envoy that reported is gone: {', '.join(gone)}")
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
        self.last_window = FleetWindow(total, by_node, silent, gone)
        if silent:
            log.warning("rollout evidence without silent Envoys: %s", ", ".join(silent))
        return total
