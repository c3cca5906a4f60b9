"""Keeping up with every record under a store prefix: list it, then watch from the last
version seen. A store outage is logged and the watch resumes; a record its handler cannot
take is logged and passed over, and any other failure is logged and the watch resumes, so
the task never dies silently and the mirror never stops following."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from inferway import background
from inferway.gateway.fleet.store import Record, Store, StoreUnavailableError

__all__ = ["PrefixWatch"]

log = logging.getLogger("inferway.fleet")

RESUME_AFTER_S = 0.5


class PrefixWatch:
    """``take`` gets each record under ``prefix`` (the listed ones first, unless
    ``list_first`` is off); ``seen`` says the last version taken, where a resumed watch goes
    on from. ``what`` names it in logs and the task's name."""

    def __init__(
        self,
        store: Store,
        prefix: str,
        take: Callable[[Record], object],
        seen: Callable[[], int],
        what: str,
        *,
        list_first: bool = True,
    ) -> None:
        self.store, self.prefix, self.what = store, prefix, what
        self._take, self._seen, self._list_first = take, seen, list_first
        self._task: asyncio.Task[None] | None = None

    async def _follow(self) -> None:
        while True:
            try:
                if self._list_first:
                    for record in await self.store.list(self.prefix):
                        self._take_one(record)
                async for record in self.store.watch(self.prefix, after=self._seen()):
                    self._take_one(record)
            except StoreUnavailableError as exc:
                log.warning("%s: %s; resuming", self.what, exc)
            except Exception:
                log.exception("%s failed; resuming", self.what)
            await asyncio.sleep(RESUME_AFTER_S)

    def _take_one(self, record: Record) -> None:
        """A record its handler cannot take is logged and passed over: one bad record must
        not stop the mirror (nor be retried forever)."""
        try:
            self._take(record)
        except Exception:
            log.exception(
                "%s: record %s (version %d) not taken", self.what, record.key, record.version
            )

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name=self.what)

    async def stop(self) -> None:
        if self._task is not None:
            task, self._task = self._task, None
            await background.cancel(task)
