"""A control-plane replica's part of the fleet, wired for ``start_gateway``: the store, the
rollout state every replica serves, every replica's Envoy evidence, and the leader-only work
(the rollouts' and the autoscaler's loops run on the elected replica only)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inferway.gateway.components import Component
from inferway.gateway.fleet.election import LeaderTask, LeaderWork
from inferway.gateway.fleet.envoy_reports import EnvoyReports, FleetStatsSource
from inferway.gateway.fleet.shared_evidence import EvidencePublisher, StoreEvidence
from inferway.gateway.fleet.shared_rollouts import SharedRolloutStore
from inferway.gateway.fleet.store import Fence, Store
from inferway.gateway.fleet.store_url import open_store

__all__ = ["ELECTION", "Fleet", "open_fleet"]

ELECTION = "loops"
"""The one election: whoever wins it runs every loop that must run once."""


def _while_leading(component: Component) -> LeaderTask:
    async def run(_fence: Fence) -> None:
        await component.start()
        try:
            await asyncio.Event().wait()
        finally:
            await component.stop()

    return run


@dataclass
class Fleet:
    store: Store
    identity: str
    ttl_s: float
    rollouts: SharedRolloutStore
    evidence: StoreEvidence
    publisher: EvidencePublisher
    silent_after_s: float
    leader: LeaderWork | None = field(default=None)

    def windows(self, stable: str, canary: str) -> FleetStatsSource:
        """The rollout evidence of every Envoy that reports to any replica."""
        return FleetStatsSource(self.evidence, stable, canary, self.silent_after_s)

    def lead(self, loops: Sequence[tuple[str, Component]]) -> LeaderWork:
        """The leader-only work: ``loops`` run while this replica leads, and only then."""
        work = LeaderWork(
            self.store,
            election=ELECTION,
            identity=self.identity,
            ttl=self.ttl_s,
            tasks=[(name, _while_leading(loop)) for name, loop in loops],
        )
        self.leader = work
        self.rollouts.fenced = work.lose
        return work

    async def start(self) -> None:
        self.rollouts.start()
        await self.evidence.start()
        await self.publisher.start()

    async def stop(self) -> None:
        await self.publisher.stop()
        await self.evidence.stop()
        await self.rollouts.stop()
        with contextlib.suppress(Exception):
            await self.store.close()


async def open_fleet(
    url: str,
    *,
    workdir: Path,
    identity: str,
    ttl_s: float,
    reports: EnvoyReports,
    push_s: float,
) -> Fleet:
    """The store ``url`` opened, with the fleet's rollout states read (before the first push,
    so a replica with an empty disk serves the fleet's weights from the start)."""
    store = open_store(url, workdir=workdir)
    holder: list[Fleet] = []

    def fence() -> Fence | None:
        leader = holder[0].leader if holder else None
        return leader.fence if leader is not None else None

    shared = SharedRolloutStore(store, fence)
    await shared.load_all()
    fleet = Fleet(
        store,
        identity,
        ttl_s,
        shared,
        StoreEvidence(store),
        EvidencePublisher(reports, store, push_s),
        silent_after_s=max(5.0, 3 * push_s),
    )
    holder.append(fleet)
    return fleet
