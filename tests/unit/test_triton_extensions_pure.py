"""The pure parts of Triton's extensions: statistics totals and the ModelConfig a served
version is described as (no server: the integration test drives both through tritonclient)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferway.backends.batching.config import BatchingConfig
from inferway.backends.batching.records import BatchRecord
from inferway.backends.models.config import ModelConfig
from inferway.backends.models.served_model import ServedModel
from inferway.backends.protocol.triton_config import model_config_json, triton_data_type
from inferway.backends.runners.base import TensorSpec
from inferway.backends.telemetry.statistics import InferenceStatistics


def _record(rows: int, waits: list[float], compute_s: float, error: str | None = None) -> Any:
    return BatchRecord("m:1", rows, len(waits), waits, compute_s, 0.0, error=error)


def test_statistics_add_up_requests_batches_and_leave_failed_batches_out_of_compute() -> None:
    book = InferenceStatistics()
    book.observe_batch("m", "1", _record(3, [0.001, 0.002], 0.010))
    book.observe_batch("m", "1", _record(1, [0.003], 0.004))
    book.observe_batch("m", "1", _record(2, [0.004], 0.5, error="RuntimeError: boom"))
    book.observe_request("m", "1", True, 0.020)
    book.observe_request("m", "1", False, 0.030)
    stats = book.get("m", "1").as_dict("m", "1")
    infer = stats["inference_stats"]
    assert infer["success"] == {"count": 1, "ns": 20_000_000}
    assert infer["fail"] == {"count": 1, "ns": 30_000_000}
    assert infer["queue"] == {"count": 4, "ns": 10_000_000}  # the failed batch waited too
    assert infer["compute_infer"] == {"count": 3, "ns": 24_000_000}  # 2 x 10 ms + 4 ms
    assert infer["compute_input"] == {"count": 3, "ns": 0}
    assert (stats["inference_count"], stats["execution_count"]) == (4, 2)
    assert [(b["batch_size"], b["compute_infer"]) for b in stats["batch_stats"]] == [
        (1, {"count": 1, "ns": 4_000_000}),
        (3, {"count": 1, "ns": 10_000_000}),
    ]
    assert stats["last_inference"] > 0
    untouched = book.get("m", "2").as_dict("m", "2")
    assert untouched["inference_count"] == 0 and untouched["last_inference"] == 0


def _served(shape_in: tuple[int, ...], mode: str, provider: str) -> ServedModel:
    config = ModelConfig(
        batching=BatchingConfig(
            mode=mode, max_batch_size=16, max_queue_delay_s=0.002, preferred_batch_sizes=(8,)
        )
    )
    return ServedModel(
        name="m",
        version="1",
        config=config,
        inputs=(TensorSpec("x", "FP32", shape_in), TensorSpec("s", "BYTES", shape_in)),
        outputs=(TensorSpec("y", "INT64", shape_in),),
        executor=None,  # type: ignore[arg-type]  # the config is built without serving
        load_seconds=0.0,
        platform="onnxruntime",
        provider=provider,
        path=Path("m/1/model.onnx"),
    )


def test_a_batching_model_leaves_the_batch_dimension_out_and_names_its_scheduler() -> None:
    config = model_config_json(_served((-1, 3), "adaptive", "CUDAExecutionProvider"))
    assert (config["platform"], config["backend"]) == ("onnxruntime_onnx", "onnxruntime")
    assert config["max_batch_size"] == 16
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [3]),
        ("s", "TYPE_STRING", [3]),
    ]
    assert config["output"][0]["dims"] == [3]
    assert config["dynamic_batching"] == {
        "preferred_batch_size": [8],
        "max_queue_delay_microseconds": 2000,
        "preserve_ordering": False,
    }
    assert config["instance_group"] == [{"name": "m", "kind": "KIND_GPU", "count": 1, "gpus": [0]}]


def test_a_model_without_a_batch_dimension_reports_max_batch_size_0_and_full_dims() -> None:
    config = model_config_json(_served((2, 3), "adaptive", "CPUExecutionProvider"))
    assert config["max_batch_size"] == 0
    assert config["input"][0]["dims"] == [2, 3]
    assert "dynamic_batching" not in config
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    unbatched = model_config_json(_served((-1, 3), "off", "CPUExecutionProvider"))
    assert unbatched["max_batch_size"] == 16 and "dynamic_batching" not in unbatched


def test_data_types_use_triton_enum_names() -> None:
    assert [triton_data_type(t) for t in ("BOOL", "UINT8", "FP16", "BF16", "BYTES")] == [
        "TYPE_BOOL",
        "TYPE_UINT8",
        "TYPE_FP16",
        "TYPE_BF16",
        "TYPE_STRING",
    ]
