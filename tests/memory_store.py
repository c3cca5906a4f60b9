"""The store contract in memory, on an injected clock, for simulations of the fleet: versioned
records, compare-and-set, fenced writes, watches, and an election whose lease expires by the
clock (as etcd's does: ``ttl`` after the last renewal).

The simulation drives the election itself, without waiting: :meth:`try_acquire` wins the lease
when nobody holds a live one, :meth:`renew` extends it, and a leader that cannot renew gives up
at ``give_up`` of the TTL after its last renewal (what ``etcd_store`` does at 70%), before the
store lets anyone else win. The async ``campaign`` of the :class:`Store` protocol is there too
(it polls the clock), so the drivers' real code runs against it unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from inferway.gateway.fleet.store import (
    ConflictError,
    Fence,
    FencedError,
    Leadership,
    Record,
    StoreHealth,
)

__all__ = ["MemoryStore"]


@dataclass
class _Lease:
    identity: str
    term: int
    renewed_at: float
    ttl: float


class MemoryStore:
    url = "memory:"

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._records: dict[str, Record] = {}
        self._revision = 0
        self._leases: dict[str, _Lease] = {}
        self._changed = asyncio.Event()
        self.refused: list[tuple[str, str]] = []
        """(key, why) of every write refused by its fence."""

    # -- records -----------------------------------------------------------------------------

    async def get(self, key: str) -> Record | None:
        return self._records.get(key)

    async def list(self, prefix: str) -> list[Record]:
        return sorted(
            (r for k, r in self._records.items() if k.startswith(prefix)), key=lambda r: r.key
        )

    def _live(self, name: str) -> _Lease | None:
        lease = self._leases.get(name)
        if lease is not None and self._clock() < lease.renewed_at + lease.ttl:
            return lease
        return None

    async def put(
        self, key: str, value: bytes, *, expect: int | None = None, fence: Fence | None = None
    ) -> Record:
        if fence is not None:
            lease = self._live(fence.name)
            if lease is None or lease.term != fence.term:
                why = f"{key}: term {fence.term} of {fence.identity} no longer leads {fence.name!r}"
                self.refused.append((key, why))
                raise FencedError(why)
        found = self._records.get(key)
        if expect is not None and (found.version if found else 0) != expect:
            raise ConflictError(key, expect, found.version if found else 0)
        self._revision += 1
        record = Record(key, value, self._revision)
        self._records[key] = record
        self._changed.set()
        self._changed = asyncio.Event()
        return record

    async def watch(self, prefix: str, *, after: int = 0) -> AsyncIterator[Record]:
        seen = after
        while True:
            changed = self._changed
            fresh = sorted(
                (
                    r
                    for r in self._records.values()
                    if r.key.startswith(prefix) and r.version > seen
                ),
                key=lambda r: r.version,
            )
            for record in fresh:
                seen = record.version
                yield record
            await changed.wait()

    # -- the election, driven by the simulation ----------------------------------------------

    def try_acquire(self, name: str, identity: str, ttl: float) -> Leadership | None:
        """Win ``name`` now if no live lease holds it (a new term: the revision)."""
        if self._live(name) is not None:
            return None
        self._revision += 1
        self._leases[name] = _Lease(identity, self._revision, self._clock(), ttl)
        return Leadership(Fence(name, identity, self._revision), ttl)

    def renew(self, held: Leadership) -> bool:
        lease = self._live(held.fence.name)
        if lease is None or lease.term != held.fence.term:
            return False
        lease.renewed_at = self._clock()
        return True

    def renewed_at(self, held: Leadership) -> float | None:
        lease = self._leases.get(held.fence.name)
        return lease.renewed_at if lease is not None and lease.term == held.fence.term else None

    # -- the rest of the Store protocol ------------------------------------------------------

    async def campaign(self, name: str, identity: str, ttl: float) -> Leadership:
        while (held := self.try_acquire(name, identity, ttl)) is None:
            await asyncio.sleep(0)
        return held

    async def resign(self, leadership: Leadership) -> None:
        leadership.lose("resigned")
        lease = self._leases.get(leadership.fence.name)
        if lease is not None and lease.term == leadership.fence.term:
            del self._leases[leadership.fence.name]

    async def leader(self, name: str) -> str | None:
        lease = self._live(name)
        return lease.identity if lease is not None else None

    async def health(self) -> StoreHealth:
        return StoreHealth(self.url, True, "in memory")

    async def close(self) -> None:
        self._leases.clear()
