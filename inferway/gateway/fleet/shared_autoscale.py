"""The autoscaler's state in the fleet's store (``autoscale/<service>``): what a new leader
continues from, and what every replica shows.

One record per service holds the decision's sequence number, the term and identity of the
leader that made it, the autoscaler's memory (samples, stabilization windows, cooldowns, a
PID's terms), the fleet load source's baselines and the decision itself with its inputs and the
Envoys that contributed them. The leader writes a decision **before** it acts on it, with its
fence and the version it last saw (compare-and-set): a deposed leader's write is refused
(``FencedError``), and a write that lost a race to another writer (``ConflictError``) is not
acted on; the writer reloads the record and continues from it. So each sequence number is
written once, by one leader, and the scale follows only decisions that were recorded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from inferway.gateway.fleet.prefix_watch import PrefixWatch
from inferway.gateway.fleet.store import (
    ConflictError,
    Fence,
    FencedError,
    Record,
    Store,
)

__all__ = ["PREFIX", "SharedAutoscaleStore"]

log = logging.getLogger("inferway.fleet")

PREFIX = "autoscale/"


class SharedAutoscaleStore:
    def __init__(self, store: Store, fence: Callable[[], Fence | None]) -> None:
        self.store = store
        self._fence = fence
        self._mirror: dict[str, Record] = {}
        self._watch = PrefixWatch(
            self.store, PREFIX, self._take, lambda: self._seen, "autoscale state watch"
        )
        self._seen = 0
        self.fenced: Callable[[str], None] = lambda reason: None
        """Called when the store refused this replica's write: it no longer leads."""

    def _take(self, record: Record) -> None:
        self._seen = max(self._seen, record.version)
        service = record.key.removeprefix(PREFIX)
        known = self._mirror.get(service)
        if known is None or known.version < record.version:
            self._mirror[service] = record

    def load(self, service: str) -> tuple[dict[str, Any], int] | None:
        """The service's last recorded state and its version (None: never decided)."""
        record = self._mirror.get(service)
        if record is None:
            return None
        try:
            return json.loads(record.value), record.version
        except ValueError as exc:
            log.warning("autoscale %s: stored state not readable: %s", service, exc)
            return None

    def services(self) -> list[str]:
        return sorted(self._mirror)

    async def refresh(self) -> None:
        """Read every record from the store now (a new leader, before its first decision)."""
        for record in await self.store.list(PREFIX):
            self._take(record)

    async def reload(self, service: str) -> None:
        record = await self.store.get(PREFIX + service)
        if record is not None:
            self._take(record)

    async def save(self, service: str, state: dict[str, Any], *, expect: int) -> int:
        """Write the service's state if its record is still at version ``expect`` (0: none
        yet), under this replica's fence; the new version. Raises FencedError (this replica
        no longer leads; ``fenced`` was told) or ConflictError (someone wrote first)."""
        fence = self._fence()
        if fence is None:
            raise FencedError(f"{PREFIX}{service}: not written, this replica does not lead")
        body = json.dumps(state, sort_keys=True).encode()
        try:
            record = await self.store.put(PREFIX + service, body, expect=expect, fence=fence)
        except FencedError as exc:
            self.fenced(str(exc))
            raise
        except ConflictError:
            await self.reload(service)
            raise
        self._take(record)
        return record.version

    async def start(self) -> None:
        self._watch.start()

    async def stop(self) -> None:
        await self._watch.stop()
