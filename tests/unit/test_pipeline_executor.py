"""The pipeline executor on fake model executors (pure asyncio, no models): independent
branches are in flight at once, a step starts only after the steps it reads, the first
failure is raised as it is and cancels the rest without leaving unretrieved errors, and a
step model that is gone answers "not ready" naming the step."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferway.backends.batching.errors import ExecutorClosedError, InvalidRequestError
from inferway.backends.models.config import ModelConfig
from inferway.backends.models.served_model import ModelNotFoundError, ServedModel
from inferway.backends.pipelines.executor import PipelineExecutor
from inferway.backends.pipelines.plan import ModelRef, ModelSignature, build_pipeline_plan
from inferway.backends.pipelines.spec import PipelineSpec
from inferway.backends.runners.base import TensorSpec

SPEC = PipelineSpec.model_validate(
    {
        "steps": [
            {"name": "embed", "model": "embed", "inputs": {"x": "request.x"}},
            {"name": "left", "model": "left", "inputs": {"x": "embed.y"}},
            {"name": "right", "model": "right", "inputs": {"x": "embed.y"}},
        ],
        "outputs": {"l": "left.y", "r": "right.y"},
    }
)
VEC = (TensorSpec("x", "FP32", (-1, 2)),)
OUT = (TensorSpec("y", "FP32", (-1, 2)),)


class FakeExecutor:
    """Adds ``offset`` to x; ``gate`` (when given) holds the call until it is set."""

    def __init__(self, name: str, log: list[str], offset: float, gate: Any = None) -> None:
        self.name, self.log, self.offset, self.gate = name, log, offset, gate
        self.fail: BaseException | None = None

    async def infer(self, inputs: Mapping[str, np.ndarray], **_: Any) -> dict[str, np.ndarray]:
        self.log.append(f"start {self.name}")
        if self.gate is not None:
            await self.gate(self.name)
        if self.fail is not None:
            raise self.fail
        self.log.append(f"end {self.name}")
        return {"y": inputs["x"] + self.offset}


def _served(name: str, executor: FakeExecutor) -> ServedModel:
    return ServedModel(
        name,
        "1",
        ModelConfig(),
        VEC,
        OUT,
        executor,
        0.0,
        "fake",
        "cpu",
        Path(name),  # type: ignore[arg-type]
    )


def _pipeline(models: dict[str, ServedModel]) -> PipelineExecutor:
    def signature(ref: ModelRef) -> ModelSignature:
        return ModelSignature(ref.name, "1", VEC, OUT)

    def lookup(ref: ModelRef) -> ServedModel:
        if ref.name not in models:
            raise ModelNotFoundError(f"model {ref.name!r} not found")
        return models[ref.name]

    return PipelineExecutor("p", build_pipeline_plan(SPEC, signature), lookup)


async def test_branches_run_at_once_after_the_step_they_read() -> None:
    log: list[str] = []
    both = asyncio.Barrier(2)

    async def gate(name: str) -> None:
        if name != "embed":
            await asyncio.wait_for(both.wait(), 5)  # only passes if both branches are in

    models = {
        n: _served(n, FakeExecutor(n, log, o, gate))
        for n, o in (("embed", 1), ("left", 10), ("right", 100))
    }
    out = await _pipeline(models).infer({"x": np.zeros((1, 2), np.float32)})
    assert out["l"].tolist() == [[11, 11]] and out["r"].tolist() == [[101, 101]]
    assert log[:2] == ["start embed", "end embed"]
    assert set(log[2:4]) == {"start left", "start right"}


async def test_the_first_failure_is_raised_and_no_error_is_left_unretrieved() -> None:
    log: list[str] = []
    unretrieved: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: unretrieved.append(ctx))
    models = {n: _served(n, FakeExecutor(n, log, 0)) for n in ("embed", "left", "right")}
    for name in ("left", "right"):
        models[name].executor.fail = InvalidRequestError(f"{name} refused")  # type: ignore[attr-defined]
    with pytest.raises(
        InvalidRequestError, match=r"pipeline 'p' step '(left|right)': (left|right) refused"
    ):
        await _pipeline(models).infer({"x": np.zeros((1, 2), np.float32)})
    gc.collect()
    await asyncio.sleep(0)
    assert unretrieved == []


async def test_a_step_model_that_is_gone_is_not_ready_naming_the_step() -> None:
    log: list[str] = []
    models = {n: _served(n, FakeExecutor(n, log, 0)) for n in ("embed", "left")}
    with pytest.raises(
        ExecutorClosedError, match="pipeline 'p' step 'right': model 'right' not found"
    ):
        await _pipeline(models).infer({"x": np.zeros((1, 2), np.float32)})


async def test_a_stopping_pipeline_refuses_new_requests_and_waits_for_those_in_flight() -> None:
    log: list[str] = []
    release = asyncio.Event()

    async def gate(name: str) -> None:
        await release.wait()

    models = {n: _served(n, FakeExecutor(n, log, 0, gate)) for n in ("embed", "left", "right")}
    pipeline = _pipeline(models)
    request = asyncio.ensure_future(pipeline.infer({"x": np.zeros((1, 2), np.float32)}))
    await asyncio.sleep(0.01)
    stopping = asyncio.ensure_future(pipeline.stop())
    await asyncio.sleep(0.01)
    assert pipeline.in_flight == 1 and not stopping.done()
    with pytest.raises(ExecutorClosedError):
        await pipeline.infer({"x": np.zeros((1, 2), np.float32)})
    release.set()
    await asyncio.wait_for(stopping, 5)
    assert (await request)["l"].shape == (1, 2)
