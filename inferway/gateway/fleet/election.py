"""The work that must happen once in a fleet (rollouts, the autoscaler, replica decisions,
webhooks) runs on the elected leader only.

:class:`LeaderWork` campaigns for the election, starts the leader-only tasks when this replica
wins, each with the leadership's :class:`Fence` so that every write it makes is refused once
another replica has won, and cancels them the moment the leadership is lost (before the lease
can expire on the store). Then it campaigns again. A leader-only task that fails is logged and
restarted while the leadership holds: nothing dies silently, and the status says what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from inferway import background
from inferway.gateway.fleet.store import (
    Fence,
    FencedError,
    Leadership,
    Store,
    StoreUnavailableError,
)

__all__ = ["LeaderTask", "LeaderWork", "LeadershipStatus"]

log = logging.getLogger("inferway.fleet")

LeaderTask = Callable[[Fence], Awaitable[None]]
"""A leader-only loop: runs until cancelled, writing through the store with the fence."""

RESTART_S = 1.0
"""Pause before a failed leader-only task is started again."""


@dataclass
class LeadershipStatus:
    """For ``status``: who this replica is, whether it leads, since when, and what it saw."""

    identity: str
    leading: bool = False
    term: int | None = None
    since: float | None = None
    terms_won: int = 0
    last_loss: str = ""
    task_failures: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "identity": self.identity,
            "leading": self.leading,
            "term": self.term,
            "since": self.since,
            "terms_won": self.terms_won,
            "last_loss": self.last_loss,
            "task_failures": dict(self.task_failures),
        }


class LeaderWork:
    def __init__(
        self,
        store: Store,
        *,
        election: str,
        identity: str,
        ttl: float,
        tasks: Sequence[tuple[str, LeaderTask]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.election = election
        self.ttl = ttl
        self.tasks = list(tasks)
        self.status = LeadershipStatus(identity)
        self._clock = clock
        self._leadership: Leadership | None = None
        self._runner: asyncio.Task[None] | None = None

    @property
    def fence(self) -> Fence | None:
        held = self._leadership
        return held.fence if held is not None and not held.lost.is_set() else None

    def lose(self, reason: str) -> None:
        """Give the leadership up now (a write of ours was fenced off: another replica leads)."""
        if self._leadership is not None:
            self._leadership.lose(reason)

    async def start(self) -> None:
        self._runner = background.start(self._run(), name=f"leader-work-{self.election}", log=log)

    async def stop(self) -> None:
        """Stop the work, and give the leadership up so another replica takes over now rather
        than after the lease runs out."""
        if self._runner is not None:
            await background.cancel(self._runner)
            self._runner = None
        held, self._leadership = self._leadership, None
        if held is not None and not held.lost.is_set():
            with contextlib.suppress(StoreUnavailableError):
                await self.store.resign(held)

    async def _run(self) -> None:
        while True:
            try:
                held = await self.store.campaign(self.election, self.status.identity, self.ttl)
            except StoreUnavailableError as exc:
                log.warning("election %r: %s", self.election, exc)
                await asyncio.sleep(RESTART_S)
                continue
            except Exception:  # this replica must stay a candidate whatever went wrong
                log.exception("election %r: campaign failed; campaigning again", self.election)
                await asyncio.sleep(RESTART_S)
                continue
            self._leadership = held
            self.status.leading, self.status.term = True, held.fence.term
            self.status.since, self.status.terms_won = self._clock(), self.status.terms_won + 1
            log.info("%s leads %r (term %d)", held.fence.identity, self.election, held.fence.term)
            running = [
                asyncio.create_task(self._keep_running(name, task, held), name=f"leader-{name}")
                for name, task in self.tasks
            ]
            try:
                await held.lost.wait()
            finally:
                await background.cancel_all(running)
                self.status.leading = False
            self.status.last_loss = held.reason
            log.warning(
                "%s no longer leads %r: %s", held.fence.identity, self.election, held.reason
            )

    async def _keep_running(self, name: str, task: LeaderTask, held: Leadership) -> None:
        while not held.lost.is_set():
            try:
                await task(held.fence)
                return
            except asyncio.CancelledError:
                raise
            except FencedError as exc:
                held.lose(f"a write was fenced off: {exc}")  # another replica leads now
                return
            except Exception as exc:
                self.status.task_failures[name] = f"{type(exc).__name__}: {exc}"
                log.exception("leader task %s failed; restarting it", name)
                await asyncio.sleep(RESTART_S)
