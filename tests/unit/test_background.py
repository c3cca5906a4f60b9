"""Background loops never end silently: an error is logged and the loop goes on; a task that
does end with an error is logged when it ends."""

from __future__ import annotations

import asyncio
import logging

import pytest

from inferway import background

log = logging.getLogger("test.background")


class _Flaky(Exception):
    pass


async def test_repeat_goes_on_through_expected_and_unexpected_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    passes: list[int] = []

    async def step() -> None:
        passes.append(len(passes))
        if len(passes) == 1:
            raise _Flaky("store out of reach")
        if len(passes) == 2:
            raise RuntimeError("a bug")

    caplog.set_level(logging.WARNING, logger="test.background")
    task = asyncio.create_task(
        background.repeat(step, every_s=0.001, what="publishing", log=log, expected=(_Flaky,))
    )
    while len(passes) < 4:
        await asyncio.sleep(0.001)
    await background.cancel(task)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in warnings] == ["publishing: store out of reach"]
    assert len(errors) == 1 and errors[0].exc_info is not None  # the traceback is kept
    assert "publishing failed" in errors[0].getMessage()
    assert task.cancelled()


async def test_repeat_asks_a_callable_interval_before_each_sleep() -> None:
    asked: list[float] = []

    def interval() -> float:
        asked.append(0.001)
        return 0.001

    async def step() -> None:
        return None

    task = asyncio.create_task(background.repeat(step, every_s=interval, what="x", log=log))
    while len(asked) < 3:
        await asyncio.sleep(0.001)
    await background.cancel(task)


async def test_a_task_that_ends_with_an_error_is_logged_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def boom() -> None:
        raise ValueError("unreadable record")

    caplog.set_level(logging.ERROR, logger="test.background")
    task = background.start(boom(), name="evidence publisher", log=log)
    with pytest.raises(ValueError):
        await task
    await asyncio.sleep(0)  # done callbacks run on the next turn of the loop
    (record,) = caplog.records
    assert "'evidence publisher' ended with an error" in record.getMessage()
    assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)


async def test_cancelled_and_finished_tasks_are_not_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def sleeper() -> None:
        await asyncio.sleep(60)

    async def quick() -> None:
        return None

    caplog.set_level(logging.DEBUG, logger="test.background")
    stopped = background.start(sleeper(), name="sleeper", log=log)
    finished = background.start(quick(), name="quick", log=log)
    await finished
    await asyncio.sleep(0)
    await background.cancel(stopped)
    await background.cancel(None)
    await asyncio.sleep(0)
    assert caplog.records == []


async def test_cancel_cancels_again_a_task_that_lost_its_cancellation(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll loop whose first cancellation is lost inside it (as Python 3.11's wait_for loses
    one when the awaited call finishes in the same turn) still stops: cancel asks again."""
    monkeypatch.setattr(background, "CANCEL_AGAIN_S", 0.05)
    cancels: list[int] = []

    async def poller() -> None:
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                cancels.append(1)
                if len(cancels) == 1:
                    continue  # the first cancellation lost
                raise

    task = background.start(poller(), name="campaign", log=log)
    await asyncio.sleep(0.02)
    async with asyncio.timeout(5):
        await background.cancel(task)
    assert task.cancelled() and len(cancels) == 2
    assert "'campaign' still running" in caplog.text


async def test_cancel_does_not_swallow_the_callers_own_cancellation() -> None:
    """A stop cancelled while it waits for a task to end is itself cancelled (the task is
    cancelled too), not left running on as if its wait had ended."""
    ended = asyncio.Event()

    async def slow_to_end() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            await ended.wait()  # a clean-up that takes a while

    task = asyncio.create_task(slow_to_end())
    await asyncio.sleep(0)
    stopper = asyncio.create_task(background.cancel(task))
    await asyncio.sleep(0.01)
    stopper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopper
    ended.set()
    await asyncio.wait({task})
    assert task.cancelled()
