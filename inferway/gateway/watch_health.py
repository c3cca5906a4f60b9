"""Supervision of the gateway's file watchers: a watch loop that fails is logged and started
again, and each watcher reports its health for ``GET /status``.

A watch task that ended on an exception used to end silently: the gateway went on serving
the last good policy, ``status`` stayed healthy, and every later edit was ignored (issue 33).
Here a failure before the first watch is in place still surfaces to the caller (a gateway
must not start without its watch), and any failure after it restarts the loop with a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["WatchHealth", "supervise"]

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
"""Waits before each restart of a failing watch loop (the last one repeats)."""


@dataclass
class WatchHealth:
    """What ``GET /status`` shows of one watcher (``watchers[]``)."""

    kind: str
    """'policy', 'endpoints' or 'certificates'."""
    path: str
    running: bool = False
    """The watch loop is in place (false while it restarts after a failure, or stopped)."""
    last_read_at: float | None = None
    """Unix time of the last successful read of the file (None: not read since start)."""
    last_error: str | None = None
    """The last failure of the loop or of an edit's processing, in words."""
    last_error_at: float | None = None
    restarts: int = 0
    """How often the watch loop was started again after a failure."""

    def read_ok(self) -> None:
        self.last_read_at = time.time()

    def failed(self, error: BaseException) -> None:
        self.last_error = f"{type(error).__name__}: {error}"
        self.last_error_at = time.time()

    def document(self) -> dict[str, Any]:
        return asdict(self) | {"healthy": self.running}


async def supervise(
    body: Callable[[], Awaitable[None]],
    health: WatchHealth,
    stop: asyncio.Event,
    ready: asyncio.Event,
) -> None:
    """Run ``body`` (a watch loop that sets ``ready`` once watching) until ``stop`` is set,
    starting it again after any failure. A failure before ``ready`` was ever set is raised:
    the watch could not be put in place at all."""
    failures = 0
    try:
        while not stop.is_set():
            try:
                await body()
                if stop.is_set():
                    return
                raise RuntimeError("the watch loop ended on its own")
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if not ready.is_set():
                    raise
                health.running = False
                health.failed(error)
                health.restarts += 1
                delay = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)]
                failures += 1
                log.error(
                    "%s watcher of %s failed (%s); restarting it in %.1f s; the live %s "
                    "keeps serving",
                    health.kind,
                    health.path,
                    health.last_error,
                    delay,
                    health.kind,
                    exc_info=True,
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()
    finally:
        health.running = False
