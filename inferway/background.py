"""Background tasks that never end silently.

A loop started with ``asyncio.create_task`` and kept only for ``stop()`` ends unseen when an
error it did not expect escapes it: nobody awaits it until shutdown, so a publisher, a watch
or a heartbeat stops working while the process looks healthy. ``repeat`` keeps a periodic step
running through any error (the expected ones as a one-line warning, the others with their
traceback); ``start`` logs a task that ends with an error the moment it ends; ``cancel``
stops one and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["cancel", "repeat", "start"]

T = TypeVar("T")


def _report_end(log: logging.Logger) -> Callable[[asyncio.Task[Any]], None]:
    def ended(task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error(
                "background task %r ended with an error; what it did has stopped",
                task.get_name(),
                exc_info=error,
            )

    return ended


def start(coro: Coroutine[Any, Any, T], *, name: str, log: logging.Logger) -> asyncio.Task[T]:
    """``create_task`` whose error, if it ends with one, is logged when it ends (not at
    shutdown, when somebody finally awaits it)."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    task.add_done_callback(_report_end(log))
    return task


async def repeat(
    step: Callable[[], Awaitable[object]],
    *,
    every_s: float | Callable[[], float],
    what: str,
    log: logging.Logger,
    expected: tuple[type[Exception], ...] = (),
) -> None:
    """Run ``step`` forever, ``every_s`` apart (a number, or a function asked before each
    sleep). An ``expected`` error (a store or a server out of reach) is a warning line; any
    other is logged with its traceback. Neither ends the loop: the next pass may succeed, and
    a loop that stops is worse than one that logs."""
    while True:
        try:
            await step()
        except expected as exc:
            log.warning("%s: %s", what, exc)
        except Exception:
            log.exception("%s failed; trying again on the next pass", what)
        await asyncio.sleep(every_s() if callable(every_s) else every_s)


async def cancel(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
