"""What a test's event loop waits on, printed shortly before pytest-timeout fails the test.

pytest-timeout shows the threads' stacks; a hung asyncio test shows only its main thread
in ``select``. This prints every pending asyncio task with the frames it is suspended in,
so a timeout in CI names the await that never finished."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import pytest

MARGIN_S = 10.0
"""How long before the test's timeout the tasks are printed."""


def test_timeout(item: pytest.Item) -> float:
    """The test's pytest-timeout limit in seconds (its marker, else the ini's); 0: none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    value = item.config.getini("timeout")
    return float(value) if value else 0.0


def pending_tasks() -> list[asyncio.Task[Any]]:
    """Every pending task of every loop (read from another thread: retried if the set
    changes while it is copied)."""
    for _ in range(5):
        try:
            return [t for t in list(asyncio.tasks._all_tasks) if not t.done()]
        except RuntimeError:  # the weak set changed size while copied
            continue
    return []


def await_chain(coro: Any, limit: int = 40) -> list[Any]:
    """The frames of a suspended coroutine and of each awaitable it awaits, outermost first
    (``Task.get_stack`` gives only the outermost one)."""
    frames = []
    while coro is not None and len(frames) < limit:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return frames


def print_tasks(nodeid: str, seconds: float) -> None:
    tasks = pending_tasks()
    out = sys.stdout
    out.write(f"\n+++ {nodeid}: {len(tasks)} pending asyncio tasks after {seconds:.0f} s +++\n")
    for task in tasks:
        out.write(f"{task.get_name()}: {task.get_coro()!r}\n")
        for frame in await_chain(task.get_coro()):
            code = frame.f_code
            out.write(f"    {code.co_filename}:{frame.f_lineno} in {code.co_name}\n")
    out.flush()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    limit = test_timeout(item)
    timer = None
    if limit > 2 * MARGIN_S:
        at = limit - MARGIN_S
        timer = threading.Timer(at, print_tasks, (item.nodeid, at))
        timer.daemon = True
        timer.start()
    try:
        return (yield)
    finally:
        if timer is not None:
            timer.cancel()
