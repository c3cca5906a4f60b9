"""BatchExecutor on a real asyncio loop with real worker threads, a numpy runner and a tiny
real ONNX Runtime model. Timing-sensitive checks poll with deadlines instead of sleeping."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from inferway.backends.batching import (
    BatchExecutor,
    BatchingConfig,
    BatchRecord,
    DeadlineExceededError,
    ExecutorClosedError,
    InvalidRequestError,
    QueueFullError,
)
from inferway.backends.runners.base import TensorSpec
from inferway.backends.runners.onnx import OnnxRunner


class DoubleRunner:
    """y = 2x; optionally slow, optionally failing on inputs of a given width."""

    inputs = (TensorSpec("x", "FP32", (-1, -1)),)
    outputs = (TensorSpec("y", "FP32", (-1, -1)),)
    provider = "numpy"

    def __init__(self, delay: float = 0.0, fail_width: int | None = None) -> None:
        self.delay = delay
        self.fail_width = fail_width
        self.seen_rows = 0
        self.calls = 0
        self.closed = False
        self.gate: threading.Event | None = None
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            x = inputs["x"]
            if self.gate is not None:
                assert self.gate.wait(5)
            if self.delay:
                time.sleep(self.delay)
            self.calls += 1
            self.seen_rows += x.shape[0]
            if self.fail_width is not None and x.shape[1] == self.fail_width:
                raise ValueError(f"cannot handle width {self.fail_width}")
            return {"y": x * 2}
        finally:
            with self._lock:
                self.active -= 1

    def close(self) -> None:
        self.closed = True


async def poll(predicate, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        await asyncio.sleep(0.001)


def fixed(**kw) -> BatchingConfig:
    base = dict(mode="fixed", max_batch_size=16, max_queue_delay_s=0.01)
    base.update(kw)
    return BatchingConfig(**base)


async def test_results_map_back_to_their_requests_under_concurrency():
    records: list[BatchRecord] = []
    runner = DoubleRunner(delay=0.002)
    ex = BatchExecutor([runner], fixed(), name="double", on_batch=records.append)
    await ex.start()
    inputs = [np.full((1 + i % 3, 4), i, dtype=np.float32) for i in range(60)]
    results = await asyncio.gather(*(ex.infer({"x": x}) for x in inputs))
    for x, out in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(out["y"], x * 2)
    assert max(r.requests for r in records) > 1, "nothing was batched"
    assert all(r.size_rows <= 16 for r in records)
    assert sum(r.requests for r in records) == 60 and runner.seen_rows == sum(
        len(x) for x in inputs
    )
    assert ex.rps() > 0 and 0 < ex.utilization() <= 1
    await ex.stop()
    assert runner.closed


async def test_runner_error_fails_exactly_the_requests_of_that_batch():
    records: list[BatchRecord] = []
    runner = DoubleRunner(fail_width=3)
    ex = BatchExecutor([runner], fixed(), name="m", on_batch=records.append)
    good = [ex.infer({"x": np.ones((1, 4), np.float32)}) for _ in range(5)]
    bad = [ex.infer({"x": np.ones((1, 3), np.float32)}) for _ in range(5)]
    outcomes = await asyncio.gather(*good, *bad, return_exceptions=True)
    assert all(isinstance(o, dict) for o in outcomes[:5])
    assert all(isinstance(o, ValueError) and "width 3" in str(o) for o in outcomes[5:])
    failed = [r for r in records if r.error]
    assert sum(r.requests for r in failed) == 5 and all("width 3" in r.error for r in failed)
    await ex.stop()


async def test_expired_request_is_never_computed():
    runner = DoubleRunner()
    runner.gate = threading.Event()
    ex = BatchExecutor([runner], fixed(max_queue_delay_s=0.0))
    busy = asyncio.ensure_future(ex.infer({"x": np.ones((1, 2), np.float32)}))
    await poll(lambda: ex.in_flight_batches == 1)
    with pytest.raises(DeadlineExceededError, match="deadline passed"):
        await ex.infer({"x": np.ones((7, 2), np.float32)}, timeout=0.02)
    runner.gate.set()
    await busy
    assert runner.seen_rows == 1  # the 7 expired rows never reached the runner
    with pytest.raises(DeadlineExceededError):
        await ex.infer({"x": np.ones((1, 2), np.float32)}, deadline=ex.clock() - 1)
    await ex.stop()


async def test_client_going_away_cancels_its_queued_request():
    runner = DoubleRunner()
    runner.gate = threading.Event()
    ex = BatchExecutor([runner], fixed(max_queue_delay_s=0.0))
    busy = asyncio.ensure_future(ex.infer({"x": np.ones((1, 2), np.float32)}))
    await poll(lambda: ex.in_flight_batches == 1)
    gone = asyncio.ensure_future(ex.infer({"x": np.ones((5, 2), np.float32)}))
    await poll(lambda: ex.queue_depth == 1)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert ex.queue_depth == 0
    runner.gate.set()
    await busy
    await ex.stop()
    assert runner.seen_rows == 1


async def test_full_queue_rejects_with_retry_after():
    runner = DoubleRunner()
    runner.gate = threading.Event()
    ex = BatchExecutor([runner], fixed(max_queue_size=2, max_queue_delay_s=0.0))
    first = asyncio.ensure_future(ex.infer({"x": np.ones((1, 2), np.float32)}))
    await poll(lambda: ex.in_flight_batches == 1)
    queued = [asyncio.ensure_future(ex.infer({"x": np.ones((1, 2), np.float32)})) for _ in "ab"]
    await poll(lambda: ex.queue_depth == 2)
    with pytest.raises(QueueFullError) as info:
        await ex.infer({"x": np.ones((1, 2), np.float32)})
    assert info.value.retry_after_s > 0
    runner.gate.set()
    await asyncio.gather(first, *queued)
    await ex.stop()


async def test_instances_run_batches_concurrently():
    runners = [DoubleRunner(delay=0.05), DoubleRunner(delay=0.05)]
    records: list[BatchRecord] = []
    ex = BatchExecutor(runners, BatchingConfig(mode="off"), on_batch=records.append)
    x = np.ones((1, 2), np.float32)
    await asyncio.gather(ex.infer({"x": x}), ex.infer({"x": x}))
    assert {r.instance for r in records} == {0, 1}
    assert all(r.max_active == 1 for r in runners)  # one call at a time per instance
    overlap = min(r.started_at + r.compute_s for r in records) - max(r.started_at for r in records)
    assert overlap > 0, "the two batches did not overlap in time"
    await ex.stop()


async def test_stop_drains_queued_work_then_refuses_new_requests():
    runner = DoubleRunner()
    ex = BatchExecutor([runner], fixed(max_queue_delay_s=5.0))  # would wait 5 s for a batch
    pending = [
        asyncio.ensure_future(ex.infer({"x": np.full((1, 2), i, np.float32)})) for i in range(5)
    ]
    await poll(lambda: ex.queue_depth == 5)
    t0 = time.monotonic()
    await ex.stop(drain=True)
    assert time.monotonic() - t0 < 2.0
    for i, fut in enumerate(pending):
        np.testing.assert_array_equal(fut.result()["y"], np.full((1, 2), 2 * i))
    with pytest.raises(ExecutorClosedError):
        await ex.infer({"x": np.ones((1, 2), np.float32)})
    assert runner.closed


async def test_stop_without_drain_fails_queued_requests():
    runner = DoubleRunner()
    runner.gate = threading.Event()
    ex = BatchExecutor([runner], fixed(max_queue_delay_s=0.0))
    running = asyncio.ensure_future(ex.infer({"x": np.ones((1, 2), np.float32)}))
    await poll(lambda: ex.in_flight_batches == 1)
    queued = asyncio.ensure_future(ex.infer({"x": np.ones((1, 2), np.float32)}))
    await poll(lambda: ex.queue_depth == 1)
    stopping = asyncio.ensure_future(ex.stop(drain=False))
    with pytest.raises(ExecutorClosedError):
        await queued
    runner.gate.set()
    await stopping
    assert (await running)["y"].shape == (1, 2)  # the batch already running still answers


async def test_inputs_must_share_one_batch_dimension():
    ex = BatchExecutor([DoubleRunner()], fixed())
    with pytest.raises(InvalidRequestError, match="batch dimension"):
        await ex.infer({"x": np.ones((2, 2), np.float32), "z": np.ones((3, 2), np.float32)})
    with pytest.raises(InvalidRequestError, match="max_batch_size"):
        await ex.infer({"x": np.ones((17, 2), np.float32)})
    await ex.stop()


async def test_batch_span_links_every_request_span():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    ex = BatchExecutor([DoubleRunner()], fixed(), name="linked", tracer_provider=provider)

    async def one(i: int) -> int:
        with tracer.start_as_current_span(f"request {i}") as span:
            await ex.infer({"x": np.ones((1, 2), np.float32)})
            return span.get_span_context().span_id

    span_ids = set(await asyncio.gather(*(one(i) for i in range(4))))
    await ex.stop()
    batches = [s for s in exporter.get_finished_spans() if s.name == "batch linked"]
    linked = {link.context.span_id for s in batches for link in s.links}
    assert linked == span_ids
    assert sum(s.attributes["batch.requests"] for s in batches) == 4
    assert all(s.parent is None and "batch.queue_wait_max_s" in s.attributes for s in batches)


def build_double_onnx(path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])], "double", [x], [y], [two]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


async def test_real_onnx_runtime_model_batches_and_maps_results_back(tmp_path: Path):
    build_double_onnx(tmp_path / "model.onnx")
    runner = OnnxRunner(tmp_path / "model.onnx", providers=["CPUExecutionProvider"])
    records: list[BatchRecord] = []
    ex = BatchExecutor([runner], fixed(max_queue_delay_s=0.005), on_batch=records.append)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1 + i % 4, 3)).astype(np.float32) for i in range(40)]
    results = await asyncio.gather(*(ex.infer({"x": x}) for x in inputs))
    for x, out in zip(inputs, results, strict=True):
        np.testing.assert_allclose(out["y"], x * 2)
    assert max(r.requests for r in records) > 1
    await ex.stop()


async def test_next_batch_is_launched_before_the_finished_batch_is_answered():
    """A finished batch frees its instance and launches the queued work in the same loop
    callback, before any of its callers runs again: a busy event loop never leaves the
    runner idle between batches."""
    runner = DoubleRunner()
    runner.gate = threading.Event()
    ex = BatchExecutor([runner], BatchingConfig(mode="off"), inline_below_s=0.0)
    seen: dict[str, int] = {}

    async def first_caller() -> dict[str, np.ndarray]:
        out = await ex.infer({"x": np.ones((1, 2), np.float32)})
        seen["queued"] = ex.queue_depth  # the first thing that runs once it is answered
        seen["in_flight"] = ex.in_flight_batches
        return out

    first = asyncio.create_task(first_caller())
    await poll(lambda: runner.active == 1)
    second = asyncio.create_task(ex.infer({"x": np.full((1, 2), 3, np.float32)}))
    await poll(lambda: ex.queue_depth == 1)
    runner.gate.set()
    np.testing.assert_array_equal((await first)["y"], np.full((1, 2), 2, np.float32))
    assert seen == {"queued": 0, "in_flight": 1}
    np.testing.assert_array_equal((await second)["y"], np.full((1, 2), 6, np.float32))
    await ex.stop()


async def test_submitted_future_cancelled_while_queued_is_never_computed():
    """``submit`` (the coroutine-free path the gRPC stream uses): cancelling its future
    drops the queued request; the others are answered."""
    runner = DoubleRunner()
    runner.gate = threading.Event()
    ex = BatchExecutor([runner], fixed(max_queue_delay_s=0.0))
    busy = ex.submit({"x": np.ones((1, 2), np.float32)})
    await poll(lambda: ex.in_flight_batches == 1)
    gone = ex.submit({"x": np.ones((5, 2), np.float32)})
    kept = ex.submit({"x": np.full((2, 2), 4, np.float32)})
    await poll(lambda: ex.queue_depth == 2)
    gone.cancel()
    await poll(lambda: ex.queue_depth == 1)
    runner.gate.set()
    np.testing.assert_array_equal((await kept)["y"], np.full((2, 2), 8, np.float32))
    await busy
    await ex.stop()
    assert runner.seen_rows == 3  # 1 + 2: the cancelled 5 rows never ran


async def test_requests_submitted_in_one_loop_pass_share_a_batch_on_an_idle_instance():
    """The scheduler decides once the loop has run what was ready, not at each submit: with
    the instance idle and no wait allowed, requests read in one pass still form one batch
    (deciding at the first submit sent it alone, and the rest in a second batch)."""
    records: list[BatchRecord] = []
    ex = BatchExecutor([DoubleRunner()], fixed(max_queue_delay_s=0.0), on_batch=records.append)
    await ex.start()
    futures = [ex.submit({"x": np.full((1, 2), i, np.float32)}) for i in range(5)]
    assert ex.queue_depth == 5 and ex.in_flight_batches == 0  # nothing decided mid-pass
    for i, fut in enumerate(futures):
        np.testing.assert_array_equal((await fut)["y"], np.full((1, 2), 2 * i, np.float32))
    await ex.stop()
    assert [r.requests for r in records] == [5]


async def test_submit_calls_on_done_once_with_the_settled_future():
    runner = DoubleRunner()
    runner.gate = threading.Event()
    ex = BatchExecutor([runner], fixed(max_queue_delay_s=0.0))
    seen: list[tuple[str, bool]] = []
    busy = ex.submit(
        {"x": np.ones((1, 2), np.float32)}, on_done=lambda f: seen.append(("busy", f.cancelled()))
    )
    await poll(lambda: ex.in_flight_batches == 1)
    gone = ex.submit(
        {"x": np.ones((5, 2), np.float32)}, on_done=lambda f: seen.append(("gone", f.cancelled()))
    )
    await poll(lambda: ex.queue_depth == 1)
    gone.cancel()
    await poll(lambda: ex.queue_depth == 0)  # the cancelled request is forgotten
    runner.gate.set()
    await busy
    await asyncio.sleep(0)
    await ex.stop()
    assert sorted(seen) == [("busy", False), ("gone", True)]
    assert runner.seen_rows == 1


async def test_cancelled_in_the_same_pass_as_its_batch_forms_is_not_computed():
    """The future is cancelled, then the finishing batch launches the next one before the
    cancel's forget callback has run (both were queued on the loop): the batch leaves it out."""
    loop = asyncio.get_running_loop()
    runner = DoubleRunner()
    runner.gate = threading.Event()
    compute = runner.run

    def run_then_cancel(inputs):  # on the worker thread, just before the batch's settle is
        out = compute(inputs)  # posted: the cancel runs first, its forget lands behind it
        if not gone.done():
            loop.call_soon_threadsafe(gone.cancel)
        return out

    runner.run = run_then_cancel
    ex = BatchExecutor([runner], fixed(max_queue_delay_s=0.0))
    busy = ex.submit({"x": np.ones((1, 2), np.float32)})
    await poll(lambda: ex.in_flight_batches == 1)
    gone = ex.submit({"x": np.ones((5, 2), np.float32)})
    kept = ex.submit({"x": np.full((2, 2), 4, np.float32)})
    runner.gate.set()
    await busy
    np.testing.assert_array_equal((await kept)["y"], np.full((2, 2), 8, np.float32))
    await ex.stop()
    assert gone.cancelled()
    assert runner.seen_rows == 3  # 1 + 2: the cancelled 5 rows never ran


async def test_a_dead_dispatcher_fails_the_queued_requests_instead_of_leaving_them_hanging():
    runner = DoubleRunner()
    ex = BatchExecutor([runner], fixed(max_queue_delay_s=5.0), name="orphan")
    queued = asyncio.ensure_future(ex.infer({"x": np.ones((1, 2), np.float32)}))
    await poll(lambda: ex.queue_depth == 1)
    (task,) = [t for t in asyncio.all_tasks() if t.get_name() == "batch-orphan"]
    task.cancel()
    with pytest.raises(ExecutorClosedError, match="dispatcher failed"):
        await asyncio.wait_for(queued, 2)
    with pytest.raises(ExecutorClosedError):
        await ex.infer({"x": np.ones((1, 2), np.float32)})
    await ex.stop()
    assert runner.closed and runner.calls == 0
