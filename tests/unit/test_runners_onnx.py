"""OnnxRunner and its helpers on real onnxruntime (CPU) with tiny deterministic models."""

from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest

from inferway.backends.models.config import ModelConfig
from inferway.backends.runners.base import Runner, TensorSpec
from inferway.backends.runners.dtypes import (
    DATATYPES,
    datatype_from_numpy,
    datatype_from_onnx,
    numpy_dtype,
    onnx_elem_type,
)
from inferway.backends.runners.onnx import (
    CPU,
    CUDA,
    TENSORRT,
    OnnxRunner,
    ProviderUnavailableError,
    resolve_providers,
)
from inferway.backends.runners.select import build_runner
from inferway.devtools.demo_models import build_add, build_mlp, mlp_reference

SMALL = (8, 16, 4)


def test_every_datatype_round_trips_through_numpy_and_onnx() -> None:
    for dt in DATATYPES:
        assert datatype_from_onnx(onnx_elem_type(dt)) == dt
        assert datatype_from_numpy(numpy_dtype(dt)) == dt
    assert datatype_from_numpy(np.dtype("S5")) == "BYTES"
    with pytest.raises(ValueError, match="unknown datatype 'FP8'"):
        numpy_dtype("FP8")
    with pytest.raises(ValueError, match="complex64"):
        datatype_from_numpy(np.complex64)


def test_add_model_specs_come_from_the_model_and_outputs_are_correct(tmp_path) -> None:
    runner = OnnxRunner(build_add(tmp_path / "m.onnx", features=4), providers=[CPU])
    assert isinstance(runner, Runner)
    assert runner.inputs == (
        TensorSpec("a", "FP32", (-1, 4)),
        TensorSpec("b", "FP32", (-1, 4)),
    )
    assert [o.name for o in runner.outputs] == ["sum", "diff"]
    assert runner.provider == CPU
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((3, 4), dtype=np.float32)
    out = runner.run({"a": a, "b": b})
    np.testing.assert_array_equal(out["sum"], a + b)
    np.testing.assert_array_equal(out["diff"], a - b)
    runner.close()


def test_int64_model_reports_int64(tmp_path) -> None:
    runner = OnnxRunner(build_add(tmp_path / "m.onnx", features=2, datatype="INT64"))
    assert runner.inputs[0].datatype == "INT64"
    a = np.array([[1, 2]], dtype=np.int64)
    assert runner.run({"a": a, "b": a})["sum"].tolist() == [[2, 4]]


def test_mlp_matches_the_numpy_reference(tmp_path) -> None:
    runner = OnnxRunner(build_mlp(tmp_path / "mlp.onnx", SMALL, seed=3), intra_op_threads=1)
    assert runner.inputs == (TensorSpec("x", "FP32", (-1, 8)),)
    assert runner.outputs == (TensorSpec("y", "FP32", (-1, 4)),)
    x = np.random.default_rng(1).standard_normal((5, 8), dtype=np.float32)
    np.testing.assert_allclose(
        runner.run({"x": x})["y"], mlp_reference(x, SMALL, seed=3), rtol=1e-4, atol=1e-5
    )


def test_demo_models_are_byte_for_byte_deterministic(tmp_path) -> None:
    a = build_mlp(tmp_path / "a.onnx", SMALL, seed=7).read_bytes()
    b = build_mlp(tmp_path / "b.onnx", SMALL, seed=7).read_bytes()
    c = build_mlp(tmp_path / "c.onnx", SMALL, seed=8).read_bytes()
    assert a == b
    assert a != c


def test_bad_inputs_are_refused_with_names(tmp_path) -> None:
    runner = OnnxRunner(build_add(tmp_path / "m.onnx"))
    a = np.zeros((1, 4), dtype=np.float32)
    with pytest.raises(ValueError, match=r"missing \['b'\], unexpected \['c'\]"):
        runner.run({"a": a, "c": a})
    with pytest.raises(ValueError, match="input 'b' has dtype float64"):
        runner.run({"a": a, "b": a.astype(np.float64)})


def test_unloadable_file_error_names_the_path(tmp_path) -> None:
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not an onnx model")
    with pytest.raises(RuntimeError, match=re.escape(str(bad))):
        OnnxRunner(bad)


def test_resolve_providers_orders_and_refuses() -> None:
    all_three = [CPU, CUDA, TENSORRT, "AzureExecutionProvider"]
    assert resolve_providers("auto", all_three) == [TENSORRT, CUDA, CPU]
    assert resolve_providers("auto", [CPU, CUDA]) == [CUDA, CPU]
    assert resolve_providers("tensorrt", all_three) == [TENSORRT, CUDA, CPU]
    assert resolve_providers("cuda", all_three) == [CUDA, CPU]
    assert resolve_providers("cpu", all_three) == [CPU]
    with pytest.raises(ProviderUnavailableError, match=r"'cuda'.*available: CPUExecutionProvider"):
        resolve_providers("cuda", [CPU])
    with pytest.raises(ValueError, match="not one of"):
        resolve_providers("gpu", all_three)


@pytest.mark.skipif(CUDA in ort.get_available_providers(), reason="CUDA EP present")
def test_requesting_an_unavailable_provider_says_what_is_available(tmp_path) -> None:
    path = build_add(tmp_path / "m.onnx")
    with pytest.raises(ProviderUnavailableError, match=r"available: .*CPUExecutionProvider"):
        OnnxRunner(path, providers=[CUDA, CPU])
    with pytest.raises(ProviderUnavailableError, match=re.escape(str(path))):
        build_runner(path, ModelConfig(provider="cuda"))


def test_build_runner_cpu_and_auto_give_working_onnx_runners(tmp_path) -> None:
    path = build_add(tmp_path / "m.onnx")
    cpu = build_runner(path, ModelConfig(provider="cpu", intra_op_threads=1))
    assert isinstance(cpu, OnnxRunner)
    assert cpu.provider == CPU
    auto = build_runner(path)
    assert auto.provider == ort.get_available_providers()[0] or auto.provider == CPU
    a = np.ones((2, 4), dtype=np.float32)
    np.testing.assert_array_equal(auto.run({"a": a, "b": a})["sum"], 2 * a)


def test_default_threads_split_the_cores_between_instances_and_workers(monkeypatch) -> None:
    from inferway.backends.runners import onnx as onnx_runner

    monkeypatch.setattr(onnx_runner.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.delenv(onnx_runner.WORKERS_ENV, raising=False)
    assert onnx_runner.default_intra_op_threads() == 8
    assert onnx_runner.default_intra_op_threads(instances=2) == 4
    monkeypatch.setenv(onnx_runner.WORKERS_ENV, "2")
    assert onnx_runner.default_intra_op_threads(instances=2) == 2
    monkeypatch.setenv(onnx_runner.WORKERS_ENV, "16")
    assert onnx_runner.default_intra_op_threads() == 1  # never below one
    monkeypatch.setenv(onnx_runner.WORKERS_ENV, "lots")
    assert onnx_runner.default_intra_op_threads() == 8  # nonsense is ignored
