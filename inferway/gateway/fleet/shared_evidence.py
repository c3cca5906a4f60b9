"""Every replica's Envoys, one evidence: each replica publishes the latest totals its Envoys
pushed to it (``evidence/<node>``), and the leader's rollout analysis reads all of them, so a
verdict counts the traffic of Envoys connected to any replica."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping

from inferway import background
from inferway.gateway.fleet.envoy_reports import (
    EVIDENCE_TTL_S,
    EnvoyReports,
    NodeReport,
    ReportsByAge,
)
from inferway.gateway.fleet.prefix_watch import PrefixWatch
from inferway.gateway.fleet.store import Record, Store, StoreUnavailableError
from inferway.gateway.rollouts.envoy_stats import ClusterTotals

__all__ = [
    "PREFIX",
    "PUBLISH_CONCURRENCY",
    "EvidencePublisher",
    "StoreEvidence",
    "decode_report",
    "encode_report",
]

log = logging.getLogger("inferway.fleet")

PREFIX = "evidence/"


def encode_report(report: NodeReport) -> bytes:
    totals = {
        cluster: {
            "requests": t.requests,
            "errors": t.errors,
            "buckets": [[str(le), n] for le, n in sorted(t.buckets.items())],
            "active": t.active,
            "healthy": t.healthy,
        }
        for cluster, t in report.totals.items()
    }
    return json.dumps({"zone": report.zone, "at": report.at, "totals": totals}).encode()


def decode_report(node: str, value: bytes) -> NodeReport:
    data = json.loads(value)
    totals: Mapping[str, ClusterTotals] = {
        cluster: ClusterTotals(
            int(t["requests"]),
            int(t["errors"]),
            {float(le): int(n) for le, n in t["buckets"]},
            active=int(t.get("active", 0)),
            healthy=None if t.get("healthy") is None else int(t["healthy"]),
        )
        for cluster, t in data["totals"].items()
    }
    return NodeReport(node, str(data["zone"]), float(data["at"]), totals)


PUBLISH_CONCURRENCY = 32
"""Writes in flight at once: every Envoy reports each push interval, so a replica with 1,000
Envoys has 1,000 changed records each round; one after the other they took seconds (a round
trip to etcd's quorum each), and an error burst waited that long to reach the leader."""


class EvidencePublisher:
    """Writes this replica's nodes' latest reports into the store every ``every_s``."""

    def __init__(
        self,
        reports: EnvoyReports,
        store: Store,
        every_s: float,
        *,
        concurrency: int = PUBLISH_CONCURRENCY,
    ) -> None:
        self.reports, self.store, self.every_s = reports, store, every_s
        self.concurrency = concurrency
        self._published: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    async def publish_once(self) -> int:
        """Write every report that changed since it was last written, ``concurrency`` at a
        time; returns how many were written (the first store error is raised after the
        others finished: what was written stays written)."""
        changed = [
            (node, report)
            for node, report in self.reports.reports().items()
            if self._published.get(node) != report.at
        ]
        slots = asyncio.Semaphore(self.concurrency)

        async def write(node: str, report: NodeReport) -> None:
            async with slots:
                await self.store.put(PREFIX + node, encode_report(report))
            self._published[node] = report.at

        results = await asyncio.gather(
            *(write(node, report) for node, report in changed), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        return len(changed)

    async def start(self) -> None:
        loop = background.repeat(
            self.publish_once,
            every_s=self.every_s,
            what="publishing Envoy evidence",
            log=log,
            expected=(StoreUnavailableError,),
        )
        self._task = background.start(loop, name="evidence publisher", log=log)

    async def stop(self) -> None:
        await background.cancel(self._task)
        self._task = None


class StoreEvidence:
    """Every node's latest report as the store holds it (kept current by a watch). A record
    older than ``expire_after_s`` (its ``at``: when a replica received the report) no longer
    counts and is listed by :meth:`expired`: the store keeps a gone Envoy's last record, so
    its age, not its presence, says whether it is still there."""

    def __init__(
        self,
        store: Store,
        *,
        expire_after_s: float = EVIDENCE_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._by_age = ReportsByAge(clock, expire_after_s)
        self._seen = 0
        self._watch = PrefixWatch(
            self.store, PREFIX, self._take, lambda: self._seen, "evidence watch"
        )

    def reports(self) -> dict[str, NodeReport]:
        return self._by_age.reports()

    def expired(self) -> dict[str, NodeReport]:
        return self._by_age.expired()

    def _take(self, record: Record) -> None:
        self._seen = max(self._seen, record.version)
        node = record.key.removeprefix(PREFIX)
        try:
            report = decode_report(node, record.value)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("evidence of %s not readable: %s", node, exc)
            return
        known = self._by_age.latest.get(node)
        if known is None or report.at >= known.at:
            self._by_age.put(report)

    async def start(self) -> None:
        self._watch.start()

    async def stop(self) -> None:
        await self._watch.stop()
