"""Small helpers the test harnesses share: poll a condition with a deadline (never
sleep-and-hope) and replace a file the way editors and ConfigMap updates do."""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

__all__ = ["PollTimeout", "poll_until", "write_atomically"]


class PollTimeout(AssertionError):
    """``poll_until``'s deadline passed (the predicate's own failures propagate as they are)."""


async def poll_until(
    predicate: Callable[[], Any | Awaitable[Any]],
    *,
    timeout: float,
    what: str,
    interval: float = 0.02,
) -> Any:
    """Poll until ``predicate`` (sync or async) returns something truthy and return that
    value; after ``timeout`` seconds fail the test, naming ``what`` was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if time.monotonic() >= deadline:
            raise PollTimeout(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def write_atomically(path: Path, text: str) -> None:
    """Write-then-rename: a watcher never reads half a file."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(text)
    os.replace(temp, path)
