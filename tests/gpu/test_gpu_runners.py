"""GPU runners on a real GPU: CUDA EP, TensorRT EP (FP16) and native TensorRT (FP16, engine
cache). Every test skips on machines without the engine it exercises."""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
import pytest

from inferway.backends.models.config import ModelConfig
from inferway.backends.runners.onnx import CPU, CUDA, TENSORRT, OnnxRunner
from inferway.backends.runners.select import build_runner
from inferway.backends.runners.tensorrt import TensorRTRunner, tensorrt_unavailable_reason
from inferway.devtools.demo_models import build_mlp, mlp_reference, write_demo_repository

pytestmark = pytest.mark.gpu

SIZES = (256, 1024, 1024, 10)
_providers = ort.get_available_providers()
needs_cuda_ep = pytest.mark.skipif(CUDA not in _providers, reason="no CUDA execution provider")
needs_trt_ep = pytest.mark.skipif(TENSORRT not in _providers, reason="no TensorRT EP")
needs_native_trt = pytest.mark.skipif(
    tensorrt_unavailable_reason() is not None,
    reason=f"native TensorRT unusable: {tensorrt_unavailable_reason()}",
)


def _rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want) / np.linalg.norm(want))


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return build_mlp(tmp_path_factory.mktemp("mlp") / "model.onnx", SIZES, seed=0)


def _x(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).standard_normal((rows, SIZES[0]), dtype=np.float32)


@needs_cuda_ep
def test_cuda_ep_runs_with_io_binding_and_matches_numpy(mlp) -> None:
    runner = OnnxRunner(mlp, providers=[CUDA, CPU])
    assert runner.provider == CUDA
    for rows in (1, 32):
        x = _x(rows)
        out = runner.run({"x": x})["y"]
        assert out.shape == (rows, SIZES[-1])
        assert _rel_err(out, mlp_reference(x, SIZES)) < 1e-3
    runner.close()


@needs_trt_ep
def test_tensorrt_ep_fp16_is_close_to_fp32(mlp, tmp_path) -> None:
    runner = OnnxRunner(mlp, providers=[TENSORRT, CUDA, CPU], fp16=True, trt_cache_dir=tmp_path)
    assert runner.provider == TENSORRT
    x = _x(8)
    assert _rel_err(runner.run({"x": x})["y"], mlp_reference(x, SIZES)) < 2e-2
    runner.close()


@needs_native_trt
def test_native_tensorrt_fp16_builds_caches_and_matches(mlp, tmp_path) -> None:
    runner = TensorRTRunner(mlp, max_batch_size=16, fp16=True, cache_dir=tmp_path)
    assert runner.provider == "tensorrt"
    assert [(s.name, s.datatype, s.shape) for s in runner.inputs] == [("x", "FP32", (-1, 256))]
    assert runner.engine_path.is_file()
    for rows in (1, 5, 16):
        x = _x(rows)
        out = runner.run({"x": x})["y"]
        assert out.shape == (rows, SIZES[-1])
        assert _rel_err(out, mlp_reference(x, SIZES)) < 2e-2
    with pytest.raises(ValueError, match="outside the engine profile"):
        runner.run({"x": _x(17)})
    built_at = runner.engine_path.stat().st_mtime_ns
    runner.close()
    again = TensorRTRunner(mlp, max_batch_size=16, fp16=True, cache_dir=tmp_path)
    assert again.engine_path == runner.engine_path
    assert again.engine_path.stat().st_mtime_ns == built_at  # loaded from cache, not rebuilt
    x = _x(3)
    assert _rel_err(again.run({"x": x})["y"], mlp_reference(x, SIZES)) < 2e-2
    again.close()
    again.close()  # idempotent


@needs_native_trt
def test_auto_selection_prefers_native_tensorrt(mlp) -> None:
    runner = build_runner(mlp, ModelConfig(fp16=True))
    assert runner.provider == "tensorrt"
    runner.close()


@pytest.mark.skipif(
    CUDA not in _providers and tensorrt_unavailable_reason() is not None, reason="no GPU engine"
)
def test_repository_serves_on_the_gpu(tmp_path) -> None:
    from inferway.backends.models.repository import ModelRepository

    write_demo_repository(
        tmp_path, "demo", (1,), config={"fp16": True, "batching": {"max_batch_size": 16}}
    )

    async def scenario() -> None:
        repo = ModelRepository(tmp_path)
        await repo.start(watch=False)
        try:
            served = repo.get("demo")
            assert served.provider != CPU
            x = _x(4)
            results = await asyncio.gather(
                *(served.executor.infer({"x": x[i : i + 1]}) for i in range(4))
            )
            got = np.concatenate([r["y"] for r in results])
            assert _rel_err(got, mlp_reference(x, SIZES)) < 2e-2
        finally:
            await repo.stop()

    asyncio.run(scenario())
