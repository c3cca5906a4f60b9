"""The native TensorRT runner's pure parts, and that selection falls back without it."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from inferway.backends.models.config import ModelConfig
from inferway.backends.runners import tensorrt as trt_runner
from inferway.backends.runners.onnx import OnnxRunner
from inferway.backends.runners.select import build_runner
from inferway.devtools.demo_models import build_add


def test_engine_cache_key_changes_with_everything_an_engine_depends_on() -> None:
    base = {"trt_version": "10.7.0", "gpu_name": "NVIDIA H100", "fp16": False, "max_batch_size": 32}
    key = trt_runner.engine_cache_key(b"onnx", **base)
    assert key == trt_runner.engine_cache_key(b"onnx", **base)
    variants = [
        trt_runner.engine_cache_key(b"onnx2", **base),
        trt_runner.engine_cache_key(b"onnx", **{**base, "trt_version": "10.8.0"}),
        trt_runner.engine_cache_key(b"onnx", **{**base, "gpu_name": "NVIDIA L4"}),
        trt_runner.engine_cache_key(b"onnx", **{**base, "fp16": True}),
        trt_runner.engine_cache_key(b"onnx", **{**base, "max_batch_size": 64}),
    ]
    assert len({key, *variants}) == 6


@pytest.mark.skipif(
    trt_runner.tensorrt_unavailable_reason() is None, reason="native TensorRT is usable here"
)
def test_without_tensorrt_the_runner_says_why_and_auto_falls_back(tmp_path) -> None:
    path = build_add(tmp_path / "model.onnx")
    reason = trt_runner.tensorrt_unavailable_reason()
    assert reason
    with pytest.raises(RuntimeError, match="native TensorRT unavailable"):
        trt_runner.TensorRTRunner(path)
    runner = build_runner(path, ModelConfig(provider="auto"))
    assert isinstance(runner, OnnxRunner)


@pytest.mark.skipif(
    trt_runner.tensorrt_unavailable_reason() is None
    or "TensorrtExecutionProvider" in ort.get_available_providers(),
    reason="TensorRT (native or as an ONNX Runtime provider) is usable here",
)
def test_explicit_tensorrt_without_any_tensorrt_is_an_error(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="provider 'tensorrt' requested"):
        build_runner(build_add(tmp_path / "model.onnx"), ModelConfig(provider="tensorrt"))
