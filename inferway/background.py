"""Background tasks that never end silently.

A loop started with ``asyncio.create_task`` and kept only for ``stop()`` ends unseen when an
error it did not expect escapes it: nobody awaits it until shutdown, so a publisher, a watch
or a heartbeat stops working while the process looks healthy. ``repeat`` keeps a periodic step
running through any error (the expected ones as a one-line warning, the others with their
traceback); ``start`` logs a task that ends with an error the moment it ends; ``cancel``
stops one and waits for it, cancelling it again while it goes on (a cancellation can be
lost inside a task: Python 3.11's ``asyncio.wait_for`` returns the result instead of
raising when the awaited call finishes in the same turn as the cancel, and a loop around
it then runs on, so a stop that awaits the task once waits forever).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

__all__ = ["cancel", "cancel_all", "repeat", "start"]

T = TypeVar("T")

CANCEL_AGAIN_S = 1.0
"""How long a cancelled task may run on before it is cancelled again."""

_log = logging.getLogger("inferway.background")


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
    """Cancel ``task`` (None: nothing) and wait until it has ended, cancelling it again every
    ``CANCEL_AGAIN_S`` while it runs on. An error it ended with (other than the
    cancellation) is raised; the caller's own cancellation is never swallowed."""
    if task is None:
        return
    await cancel_all([task])
    error = None if task.cancelled() else task.exception()
    if error is not None:
        raise error


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel each task and wait until every one has ended (cancelling again the ones that
    run on, with a warning naming them); what they ended with is not raised."""
    pending = {task for task in tasks if not task.done()}
    for task in pending:
        task.cancel()
    waited = 0.0
    while pending:
        _, pending = await asyncio.wait(pending, timeout=CANCEL_AGAIN_S)
        waited += CANCEL_AGAIN_S
        for task in pending:
            _log.warning(
                "task %r still running %.0f s after it was cancelled (a cancellation lost "
                "inside it, or a slow clean-up); cancelling it again",
                task.get_name(),
                waited,
            )
            task.cancel()
