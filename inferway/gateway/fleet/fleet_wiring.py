"""A control-plane replica's part of the fleet, wired for ``start_gateway``: the store, the
rollout state every replica serves, every replica's Envoy evidence, and the leader-only work
(the rollouts' and the autoscaler's loops run on the elected replica only)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferway import background
from inferway.gateway.components import Component
from inferway.gateway.fleet.election import LeaderTask, LeaderWork
from inferway.gateway.fleet.envoy_reports import EnvoyReports, FleetStatsSource, NewestReports
from inferway.gateway.fleet.fleet_limits import FleetLimits
from inferway.gateway.fleet.shared_autoscale import SharedAutoscaleStore
from inferway.gateway.fleet.shared_evidence import EvidencePublisher, StoreEvidence
from inferway.gateway.fleet.shared_rollouts import SharedRolloutStore
from inferway.gateway.fleet.store import Fence, Store, StoreHealth, StoreUnavailableError
from inferway.gateway.fleet.store_url import open_store

__all__ = ["ELECTION", "Fleet", "open_fleet"]

ELECTION = "loops"
"""The one election: whoever wins it runs every loop that must run once."""
REPLICAS = "replicas/"
HEARTBEAT_S = 1.0
REPLICA_STALE_S = 15.0
"""A replica not heard from for this long is no longer listed."""

log = logging.getLogger("inferway.fleet")


def _while_leading(component: Component, refresh: Callable[[], Awaitable[None]]) -> LeaderTask:
    async def run(_fence: Fence) -> None:
        await refresh()  # a failure is the task's: LeaderWork logs it and starts it again
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
    autoscale: SharedAutoscaleStore
    leader: LeaderWork | None = field(default=None)
    limits: FleetLimits | None = field(default=None)
    """The fleet-wide rate limits' splits (set by ``start_gateway``)."""
    admin_url: str = ""
    _replicas: list[dict[str, Any]] = field(default_factory=list)
    _health: StoreHealth | None = None
    _beat: asyncio.Task[None] | None = None
    _beats: int = 0

    def advertise(self, admin_url: str) -> None:
        """This replica's admin API, for the others (a command they get is forwarded here
        while this replica leads)."""
        self.admin_url = admin_url

    def replicas(self) -> list[dict[str, Any]]:
        """Every replica heard from in the last ``REPLICA_STALE_S`` (registry records)."""
        now = time.time()
        return [r for r in self._replicas if now - r["at"] <= REPLICA_STALE_S]

    def current_leader(self) -> str | None:
        if self.leader is not None and self.leader.status.leading:
            return self.identity
        leading = sorted((r for r in self.replicas() if r["leading"]), key=lambda r: -r["at"])
        return leading[0]["id"] if leading else None

    def leader_admin(self) -> str | None:
        leader = self.current_leader()
        return next((r["admin"] for r in self.replicas() if r["id"] == leader), None)

    def health_json(self) -> dict[str, Any]:
        health = self._health
        if health is None:
            return {"url": self.store.url, "ok": None, "detail": "not checked yet", "members": []}
        return {
            "url": health.url,
            "ok": health.ok,
            "detail": health.detail,
            "members": list(health.members),
        }

    async def _beat_once(self) -> None:
        try:
            if self._beats % 5 == 0:
                self._health = await self.store.health()
            record = {
                "id": self.identity,
                "admin": self.admin_url,
                "leading": self.leader is not None and self.leader.status.leading,
                "at": time.time(),
            }
            await self.store.put(REPLICAS + self.identity, json.dumps(record).encode())
            self._replicas = [json.loads(r.value) for r in await self.store.list(REPLICAS)]
        except StoreUnavailableError as exc:
            self._health = StoreHealth(self.store.url, False, str(exc))
        except (ValueError, KeyError) as exc:
            log.warning("fleet registry: unreadable record: %s", exc)
        finally:
            self._beats += 1

    async def _heartbeat(self) -> None:
        await background.repeat(
            self._beat_once, every_s=HEARTBEAT_S, what="fleet heartbeat", log=log
        )

    def newest_reports(self) -> NewestReports:
        """Every Envoy's newest report, from any replica (this replica's own Envoys as they
        report, not a publish round later): what the leader's loops read."""
        return NewestReports(self.evidence, self.publisher.reports)

    def windows(self, stable: str, canary: str) -> FleetStatsSource:
        """The rollout evidence of every Envoy that reports to any replica."""
        return FleetStatsSource(self.newest_reports(), stable, canary, self.silent_after_s)

    def lead(self, loops: Sequence[tuple[str, Component]]) -> LeaderWork:
        """The leader-only work: ``loops`` run while this replica leads, and only then, each
        from the fleet's latest state (read from the store once elected)."""
        work = LeaderWork(
            self.store,
            election=ELECTION,
            identity=self.identity,
            ttl=self.ttl_s,
            tasks=[(name, _while_leading(loop, self.rollouts.refresh)) for name, loop in loops],
        )
        self.leader = work
        self.rollouts.fenced = work.lose
        self.autoscale.fenced = work.lose
        return work

    def fence(self) -> Fence | None:
        """This replica's fence while it leads (None: it does not)."""
        return self.leader.fence if self.leader is not None else None

    async def start(self) -> None:
        self.rollouts.start()
        await self.autoscale.start()
        await self.evidence.start()
        await self.publisher.start()
        self._beat = background.start(self._heartbeat(), name="fleet heartbeat", log=log)

    async def stop(self) -> None:
        await background.cancel(self._beat)
        self._beat = None
        await self.publisher.stop()
        await self.evidence.stop()
        await self.autoscale.stop()
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
    evidence_ttl_s: float | None = None,
) -> Fleet:
    """The store ``url`` opened, with the fleet's rollout states read (before the first push,
    so a replica with an empty disk serves the fleet's weights from the start).
    ``evidence_ttl_s``: an Envoy's evidence in the store stops counting this long after its
    last report (it is listed as gone); None: ``EVIDENCE_TTL_S``."""
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
        StoreEvidence(store)
        if evidence_ttl_s is None
        else StoreEvidence(store, expire_after_s=evidence_ttl_s),
        EvidencePublisher(reports, store, push_s),
        silent_after_s=max(5.0, 3 * push_s),
        autoscale=SharedAutoscaleStore(store, fence),
    )
    holder.append(fleet)
    return fleet
