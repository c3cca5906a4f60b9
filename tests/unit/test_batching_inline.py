"""Tiny batches run on the event loop thread; real compute stays on the worker threads."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NoOpTracerProvider

from inferway.backends.batching import BatchExecutor, BatchingConfig
from inferway.backends.runners.base import TensorSpec
from inferway.backends.telemetry.tracing import backend_tracer, is_tracing


class ThreadRecordingRunner:
    """y = x + 1; remembers which thread ran each batch."""

    inputs = (TensorSpec("x", "FP32", (-1, 2)),)
    outputs = (TensorSpec("y", "FP32", (-1, 2)),)
    provider = "numpy"

    def __init__(self) -> None:
        self.threads: list[int] = []

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.threads.append(threading.get_ident())
        return {"y": inputs["x"] + 1}

    def close(self) -> None:
        pass


async def _run_some(inline_below_s: float) -> tuple[ThreadRecordingRunner, BatchExecutor]:
    runner = ThreadRecordingRunner()
    ex = BatchExecutor([runner], BatchingConfig(mode="off"), inline_below_s=inline_below_s)
    for i in range(5):  # one at a time: the first teaches the cost model
        x = np.full((1, 2), i, np.float32)
        out = await ex.infer({"x": x})
        np.testing.assert_array_equal(out["y"], x + 1)
    return runner, ex


async def test_cheap_batches_run_inline_once_their_cost_is_known() -> None:
    runner, ex = await _run_some(inline_below_s=1.0)
    loop_thread = threading.get_ident()
    assert runner.threads[0] != loop_thread  # no cost known yet: a worker thread
    assert runner.threads[1:] == [loop_thread] * 4
    assert ex.rps() > 0 and ex.in_flight_batches == 0
    await ex.stop()


async def test_inline_off_keeps_every_batch_on_the_worker_thread() -> None:
    runner, ex = await _run_some(inline_below_s=0.0)
    assert threading.get_ident() not in runner.threads
    await ex.stop()


async def test_inline_failure_fails_only_that_request_and_the_executor_keeps_serving() -> None:
    runner, ex = await _run_some(inline_below_s=1.0)
    bad = {"x": np.ones((1, 2), np.float32)}
    runner.run = lambda inputs: {"y": np.ones((3, 2), np.float32)}  # type: ignore[method-assign]
    try:
        await ex.infer(bad)
    except RuntimeError as exc:
        assert "expected 1 rows first" in str(exc)
    else:
        raise AssertionError("a wrong-shaped output must fail the request")
    del runner.run  # back to the class's method
    out = await ex.infer({"x": np.zeros((1, 2), np.float32)})
    np.testing.assert_array_equal(out["y"], np.ones((1, 2), np.float32))
    await ex.stop()


def test_is_tracing_only_with_a_real_provider() -> None:
    assert not is_tracing(backend_tracer(NoOpTracerProvider()))
    assert is_tracing(backend_tracer(TracerProvider()))
