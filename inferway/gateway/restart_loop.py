"""The restart loop shared by the process supervisors (Envoy's, ``supervisor.py``, and the
control plane's child, ``control_plane_process.py``): wait for the process to exit, back off,
start it again, until the supervisor stops.

The backoff grows while a process keeps crashing and goes back to its start once the process
stayed up ``stable_after`` seconds, so a crash loop slows down and a rare crash does not. A
restart that fails to start the process (OSError) is retried after the next delay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["Backoff", "Exit", "keep_restarting"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Restart delays: ``initial * factor**n`` capped at ``maximum``; back to ``initial`` once
    the process has run for ``stable_after`` seconds."""

    initial: float = 0.2
    maximum: float = 10.0
    factor: float = 2.0
    stable_after: float = 10.0

    def next_delay(self, previous: float | None, uptime: float) -> float:
        if previous is None or uptime >= self.stable_after:
            return self.initial
        return min(previous * self.factor, self.maximum)


@dataclass(frozen=True)
class Exit:
    """The supervised process ``pid`` exited with ``code`` after ``uptime`` seconds."""

    pid: int
    code: int
    uptime: float


async def keep_restarting(
    name: str,
    *,
    backoff: Backoff,
    stopping: Callable[[], bool],
    wait_exit: Callable[[], Awaitable[Exit]],
    crashed: Callable[[Exit, float], None],
    respawn: Callable[[], Awaitable[None]],
    restarted: Callable[[], Awaitable[None]],
) -> None:
    """Run until ``stopping()``: ``wait_exit()`` for the running process; ``crashed(exit,
    delay)`` (record and log it); sleep ``delay``; ``respawn()`` (OSError: logged, retried
    after the next delay); ``restarted()`` once it runs again. ``name`` is for the log."""
    delay: float | None = None
    while not stopping():
        exit = await wait_exit()
        if stopping():
            return
        delay = backoff.next_delay(delay, exit.uptime)
        crashed(exit, delay)
        await asyncio.sleep(delay)
        if stopping():
            return
        try:
            await respawn()
        except OSError as exc:
            log.error("could not restart %s: %s", name, exc)
            continue
        await restarted()
