"""fill_when_busy wired end to end in BatchExecutor: a real loop kept busy, real worker
threads, the loop's busy share read from the kernel (schedstat) by the executor itself."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Mapping

import numpy as np
import pytest

from inferway.backends.batching import BatchExecutor, BatchingConfig, BatchRecord
from inferway.backends.runners.base import TensorSpec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="schedstat")


class SlowDouble:
    """y = 2x, 2 ms a batch (sleeping, so the worker thread leaves the loop's core alone)."""

    inputs = (TensorSpec("x", "FP32", (-1, 4)),)
    outputs = (TensorSpec("y", "FP32", (-1, 4)),)
    provider = "numpy"

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(0.002)
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


async def busy_loop_traffic(ex: BatchExecutor, seconds: float) -> tuple[int, float]:
    """Keep the loop busy all the time (spinning 9 ms at a go, then only yielding: a sleep
    would idle it for as long as the host's timers take, several ms on a loaded VM) while a
    request arrives every 0.5 ms or so; returns how many were answered (each checked) and
    the highest busy share the scheduler was given while the loop spun (the drain after it
    is quieter)."""
    stop = time.monotonic() + seconds
    answered = 0
    peak = 0.0

    async def spin() -> None:
        nonlocal peak
        while time.monotonic() < stop:
            until = time.monotonic() + 0.009
            while time.monotonic() < until:
                pass
            await asyncio.sleep(0)  # let the requests and the batches' answers through
            peak = max(peak, ex.scheduler.loop_busy)

    async def one(i: int) -> None:
        nonlocal answered
        x = np.full((1, 4), i, dtype=np.float32)
        out = await ex.infer({"x": x})
        np.testing.assert_array_equal(out["y"], x * 2)
        answered += 1

    async def produce() -> None:
        tasks, i = [], 0
        while time.monotonic() < stop:
            tasks += [asyncio.ensure_future(one(i)), asyncio.ensure_future(one(i + 1))]
            i += 2
            await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)

    await asyncio.gather(spin(), produce())
    return answered, peak


@pytest.mark.parametrize("fill", [True, False])
async def test_a_busy_loop_makes_the_executor_fill_batches(fill: bool) -> None:
    records: list[BatchRecord] = []
    cfg = BatchingConfig(
        mode="adaptive",
        max_batch_size=64,
        max_queue_delay_s=0.02,
        latency_slo_s=0.5,
        fill_when_busy=fill,
    )
    ex = BatchExecutor([SlowDouble()], cfg, name="fill", on_batch=records.append, measure_loop=True)
    await ex.start()
    try:
        answered, peak_busy = await busy_loop_traffic(ex, 1.5)
    finally:
        await ex.stop()
    assert answered == sum(r.requests for r in records) > 0
    if fill:
        assert peak_busy >= 0.8, "the spinning loop was not measured as busy"
        assert ex.scheduler.filled > 0, "a busy loop never waited for a fuller batch"
    else:
        assert ex.scheduler.filled == 0


async def test_the_loop_is_measured_only_when_asked() -> None:
    cfg = BatchingConfig(mode="adaptive")
    quiet = BatchExecutor([SlowDouble()], cfg, name="quiet")
    await quiet.start()
    try:
        await busy_loop_traffic(quiet, 0.3)
        assert quiet.scheduler.loop_busy == 0.0  # tests drive the scheduler deterministically
    finally:
        await quiet.stop()
