"""Batches on the event loop's thread (``compute_on``): where ``auto`` puts them, and what the
executor does there: one decision per loop pass, so requests read in the same pass share a
batch; cancels, failures and draining as on worker threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from inferway.backends.batching import BatchExecutor, BatchingConfig, BatchRecord
from inferway.backends.batching.placement import (
    CPU_PROVIDER,
    batches_on_loop,
    placement_reason,
)
from inferway.backends.runners.base import TensorSpec
from inferway.backends.runners.onnx import OnnxRunner
from inferway.devtools.demo_models import build_mlp, mlp_reference


class RowsRunner:
    """y = x + 1; records each batch's rows and the thread that ran it."""

    inputs = (TensorSpec("x", "FP32", (-1, 2)),)
    outputs = (TensorSpec("y", "FP32", (-1, 2)),)

    def __init__(self, provider: str = CPU_PROVIDER, fail: bool = False) -> None:
        self.provider = provider
        self.fail = fail
        self.batches: list[int] = []
        self.threads: list[int] = []

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.threads.append(threading.get_ident())
        self.batches.append(inputs["x"].shape[0])
        if self.fail:
            raise RuntimeError("runner broke")
        return {"y": inputs["x"] + 1}

    def close(self) -> None:
        pass


def _row(i: int) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 2), i, np.float32)}


@pytest.mark.parametrize(
    ("compute_on", "instances", "cpus", "provider", "expected", "because"),
    [
        ("auto", 1, 1, CPU_PROVIDER, True, "one CPU instance, 1 CPU allowed"),
        ("auto", 1, 2, CPU_PROVIDER, False, "2 CPUs allowed"),
        ("auto", 2, 1, CPU_PROVIDER, False, "2 instances"),
        ("auto", 1, 1, "CUDAExecutionProvider", False, "provider CUDAExecutionProvider"),
        ("loop", 1, 8, "tensorrt", True, "compute_on: loop"),
        ("workers", 1, 1, CPU_PROVIDER, False, "compute_on: workers"),
    ],
)
def test_auto_puts_batches_on_the_loop_only_for_one_cpu_instance_on_one_cpu(
    compute_on: str, instances: int, cpus: int, provider: str, expected: bool, because: str
) -> None:
    config = BatchingConfig(compute_on=compute_on, instances=instances)  # type: ignore[arg-type]
    runners = [RowsRunner(provider) for _ in range(instances)]
    assert batches_on_loop(config, runners, cpus) is expected
    reason = placement_reason(config, runners, cpus)
    assert reason.startswith("batches run on the event loop" if expected else "batches run on w")
    assert because in reason


def test_a_runner_without_a_provider_is_not_taken_for_a_cpu_one() -> None:
    class Bare:
        inputs = RowsRunner.inputs
        outputs = RowsRunner.outputs

    assert not batches_on_loop(BatchingConfig(), [Bare()], 1)  # type: ignore[list-item]
    assert "provider unknown" in placement_reason(BatchingConfig(), [Bare()], 1)  # type: ignore[list-item]


def test_compute_on_loop_takes_one_instance_and_unknown_values_are_refused() -> None:
    with pytest.raises(ValidationError, match="takes one instance, not 2"):
        BatchingConfig(compute_on="loop", instances=2)
    with pytest.raises(ValidationError, match="compute_on"):
        BatchingConfig(compute_on="gpu")  # type: ignore[arg-type]
    assert BatchingConfig().compute_on == "auto"


async def _submit_in_one_pass(compute_on: str, n: int) -> RowsRunner:
    runner = RowsRunner()
    ex = BatchExecutor([runner], BatchingConfig(compute_on=compute_on), inline_below_s=0.0)  # type: ignore[arg-type]
    futures = [ex.submit(_row(i)) for i in range(n)]  # no await between them: one loop pass
    outs = await asyncio.gather(*futures)
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out["y"], _row(i)["x"] + 1)
    await ex.stop()
    return runner


async def test_on_the_loop_requests_read_in_one_pass_share_one_batch_on_the_loop_thread() -> None:
    runner = await _submit_in_one_pass("loop", 10)
    assert runner.batches == [10]
    assert runner.threads == [threading.get_ident()]


async def test_on_workers_an_idle_instance_takes_the_first_request_alone() -> None:
    runner = await _submit_in_one_pass("workers", 10)
    assert runner.batches[0] == 1 and sum(runner.batches) == 10
    assert threading.get_ident() not in runner.threads


async def test_on_the_loop_a_batch_is_answered_before_the_next_one_computes() -> None:
    answered: list[int] = []
    seen_answered: list[int] = []
    runner = RowsRunner()
    original = runner.run

    def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen_answered.append(len(answered))
        return original(inputs)

    runner.run = run  # type: ignore[method-assign]
    ex = BatchExecutor([runner], BatchingConfig(compute_on="loop", max_batch_size=4))
    futures = [ex.submit(_row(i)) for i in range(10)]
    for fut in futures:
        fut.add_done_callback(lambda _: answered.append(1))
    await asyncio.gather(*futures)
    assert runner.batches == [4, 4, 2]
    assert seen_answered == [0, 4, 8]  # each batch's callers heard back before the next ran
    await ex.stop()


async def test_on_the_loop_a_request_cancelled_before_the_pass_ends_is_not_computed() -> None:
    runner = RowsRunner()
    ex = BatchExecutor([runner], BatchingConfig(compute_on="loop"))
    futures = [ex.submit(_row(i)) for i in range(3)]
    futures[1].cancel()
    await asyncio.gather(futures[0], futures[2])
    assert runner.batches == [2]
    gone = [ex.submit(_row(i)) for i in range(2)]  # a whole batch whose callers all left
    for fut in gone:
        fut.cancel()
    await asyncio.sleep(0.01)  # the pump due this pass finds only cancelled ones
    assert runner.batches == [2] and ex.queue_depth == 0
    out = await ex.infer(_row(5))
    np.testing.assert_array_equal(out["y"], _row(5)["x"] + 1)
    assert runner.batches == [2, 1]
    assert ex.queue_depth == 0 and ex.in_flight_batches == 0
    await ex.stop()


async def test_on_the_loop_a_failing_batch_fails_its_requests_and_the_next_pass_serves() -> None:
    runner = RowsRunner(fail=True)
    ex = BatchExecutor([runner], BatchingConfig(compute_on="loop"))
    futures = [ex.submit(_row(i)) for i in range(4)]
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and "runner broke" in str(r) for r in results)
    runner.fail = False
    out = await ex.infer(_row(7))
    np.testing.assert_array_equal(out["y"], _row(7)["x"] + 1)
    assert runner.batches == [4, 1] and ex.in_flight_batches == 0
    await ex.stop()


async def test_on_the_loop_stop_drains_what_is_queued() -> None:
    runner = RowsRunner()
    ex = BatchExecutor([runner], BatchingConfig(compute_on="loop"))
    futures = [ex.submit(_row(i)) for i in range(5)]
    await ex.stop(drain=True)  # before the loop's pass decided anything
    outs = await asyncio.gather(*futures)
    assert [float(o["y"][0, 0]) for o in outs] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert sum(runner.batches) == 5


async def test_auto_on_one_cpu_serves_a_real_onnx_model_on_the_loop(tmp_path: Path) -> None:
    sizes = (8, 16, 4)
    runner = OnnxRunner(build_mlp(tmp_path / "m.onnx", sizes), intra_op_threads=1)
    records: list[BatchRecord] = []
    ex = BatchExecutor([runner], BatchingConfig(max_batch_size=64), cpus=1, on_batch=records.append)
    assert ex.on_loop and "one CPU instance, 1 CPU allowed" in ex.placement
    name = runner.inputs[0].name
    x = np.linspace(-1, 1, 32 * sizes[0], dtype=np.float32).reshape(32, sizes[0])
    outs = await asyncio.gather(*(ex.infer({name: x[i : i + 1]}) for i in range(32)))
    got = np.concatenate([next(iter(o.values())) for o in outs])
    np.testing.assert_allclose(got, mlp_reference(x, sizes=sizes, seed=0), rtol=1e-4, atol=1e-5)
    assert [r.size_rows for r in records] == [32]  # all 32 were read before the batch formed
    await ex.stop()
