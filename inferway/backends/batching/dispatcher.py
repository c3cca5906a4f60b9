"""When the executor's ``pump`` runs, besides the finish of a batch (which pumps at once).

One task per executor acts when nothing else would: at the time the scheduler named, after a
cancel, and while draining on stop. Submits ask for a pump at the end of the loop's pass
(``pump_soon``): one decision for every request read in that pass, so they can share a batch.

A collaborator of BatchExecutor: it owns the task, its timer, its wake-up future and the pump
due this pass, and calls back the executor's ``pump`` (launch what can run, return what to
wait for)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .records import Idle, WaitUntil

__all__ = ["Dispatcher"]

# the executor's logger, so that log filters on it still see these messages
log = logging.getLogger("inferway.backends.batching.executor")


class Dispatcher:
    """Sleeps until ``pump``'s answer says to look again (or ``wake`` is called); stops when
    ``pump`` returns None. If it fails, ``on_crash`` runs before the error propagates."""

    def __init__(
        self,
        name: str,
        *,
        pump: Callable[[], WaitUntil | Idle | None],
        clock: Callable[[], float],
        on_crash: Callable[[], None],
    ) -> None:
        self.name = name
        self._pump = pump
        self._clock = clock
        self._on_crash = on_crash
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.sleeping_until: float | None = None
        """When the task's timer fires; None: no timer (asleep until woken, or awake)."""
        self._pump_due: asyncio.Handle | None = None

    def pump_soon(self) -> None:
        """Pump once the loop has run what is ready now; asked again within the pass, still
        once. Only after ``start``."""
        if self._pump_due is None:
            assert self._loop is not None
            self._pump_due = self._loop.call_soon(self._pump_now)

    def _pump_now(self) -> None:
        self._pump_due = None
        self._pump()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._task = loop.create_task(self._run(), name=f"batch-{self.name}")

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def join(self) -> None:
        """Wait for the task to end, however it ended (a crash was logged already); being
        cancelled while waiting leaves the task running."""
        task = self._task
        if task is None:
            return
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: asyncio must not warn that nobody looked

    async def _sleep(self, delay: float | None) -> None:
        assert self._loop is not None
        waiter = self._loop.create_future()
        self._waiter = waiter
        handle = None
        if delay is not None:
            handle = self._loop.call_later(max(delay, 0.0), _resolve, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()

    async def _run(self) -> None:
        try:
            while True:
                action = self._pump()
                if action is None:
                    return
                if type(action) is WaitUntil:
                    self.sleeping_until = action.at
                    await self._sleep(action.at - self._clock())
                else:
                    self.sleeping_until = None
                    await self._sleep(None)
        except BaseException as exc:
            self._on_crash()
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("model %r: batch dispatcher failed", self.name)
            raise


def _resolve(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)
