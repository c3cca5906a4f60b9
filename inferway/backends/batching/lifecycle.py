"""Start, stop and the dispatcher task of a BatchExecutor.

These run rarely (once per executor, or when the scheduler named a time), so they live apart
from the per-request path in ``executor.py``. They are a base class rather than a helper
object so that ``self._wake()`` on that path stays one plain method call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..runners.base import Runner
from .errors import ExecutorClosedError
from .records import Idle, Pending, WaitUntil
from .scheduler import Scheduler
from .window_stats import WindowStats

__all__ = ["ExecutorLifecycle"]

# the executor's logger, so that log filters on it still see these messages
log = logging.getLogger("inferway.backends.batching.executor")


class ExecutorLifecycle:
    """Base of BatchExecutor: its ``__init__`` sets these; ``_pump`` and ``_fail`` are its."""

    name: str
    clock: Callable[[], float]
    _runners: list[Runner]
    _sched: Scheduler
    _pools: list[ThreadPoolExecutor]
    _loop: asyncio.AbstractEventLoop | None
    _task: asyncio.Task[None] | None
    _waiter: asyncio.Future[None] | None
    _sleep_until: float | None
    _closing: bool
    _drain: bool
    _closed: bool
    _stats: WindowStats
    _pump: Callable[[], WaitUntil | Idle | None]
    _fail: Callable[[Pending, BaseException], None]

    @property
    def closed(self) -> bool:
        return self._closing

    async def start(self) -> None:
        self._start_now()

    def _start_now(self) -> None:
        if self._task is not None:
            return
        if self._closing:
            raise ExecutorClosedError(f"model {self.name!r}: executor was stopped")
        self._loop = asyncio.get_running_loop()
        self._stats.restart(self.clock())
        self._task = self._loop.create_task(self._dispatch_loop(), name=f"batch-{self.name}")

    async def stop(self, drain: bool = True) -> None:
        """Refuse new requests; finish queued ones (``drain``) or fail them with
        ExecutorClosedError; wait for running batches; close the runners."""
        if not self._closing:
            self._closing = True
            self._drain = drain
        elif not drain:
            self._drain = False
        self._wake()
        if self._task is not None:
            # a crashed dispatcher was logged already; resources are released regardless
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)
        if self._closed:
            return
        self._closed = True
        for pool in self._pools:
            pool.shutdown(wait=False)
        for runner in self._runners:
            try:
                runner.close()
            except Exception:
                log.exception("model %r: closing a runner failed", self.name)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

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

    async def _dispatch_loop(self) -> None:
        try:
            while True:
                action = self._pump()
                if action is None:
                    return
                if type(action) is WaitUntil:
                    self._sleep_until = action.at
                    await self._sleep(action.at - self.clock())
                else:
                    self._sleep_until = None
                    await self._sleep(None)
        except BaseException as exc:
            self._closing = True
            for req in self._sched.clear():
                self._fail(req, ExecutorClosedError(f"model {self.name!r}: dispatcher failed"))
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("model %r: batch dispatcher failed", self.name)
            raise


def _resolve(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)
