"""A served model version described as Triton's ``ModelConfig``, for the model configuration
extension (``GET /v2/models/{m}/config``, gRPC ``ModelConfig``).

``perf_analyzer`` and Triton's client tools read it before sending anything: whether the model
batches (``max_batch_size`` above 0, then every tensor's ``dims`` leave out the batch
dimension), each tensor's ``data_type`` and ``dims`` (-1: any size), and the scheduler
(``dynamic_batching``). One JSON-shaped dict serves both wires: HTTP sends it as is, gRPC
parses it into the message, so the two cannot disagree. Field names are Triton's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferway.backends.models.scan import MODEL_FILE

if TYPE_CHECKING:
    from inferway.backends.models.served_model import ServedModel
    from inferway.backends.runners.base import TensorSpec

__all__ = ["PLATFORMS", "model_config_json", "triton_data_type"]

PLATFORMS: dict[str, tuple[str, str]] = {
    "onnxruntime": ("onnxruntime_onnx", "onnxruntime"),
    "tensorrt": ("tensorrt_plan", "tensorrt"),
    "pipeline": ("ensemble", "ensemble"),
}
"""inferway's runner platform -> Triton's (platform, backend) names for the same engine."""


def triton_data_type(datatype: str) -> str:
    """The Open Inference Protocol's datatype name (``FP32``) as Triton's enum (``TYPE_FP32``);
    ``BYTES`` is Triton's ``TYPE_STRING``."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _batches(model: ServedModel) -> bool:
    """Triton's notion of a batching model: every tensor's first dimension is the batch."""
    tensors = (*model.inputs, *model.outputs)
    return all(len(t.shape) >= 1 and t.shape[0] == -1 for t in tensors)


def _tensor(spec: TensorSpec, batched: bool) -> dict[str, Any]:
    dims = list(spec.shape[1:] if batched else spec.shape)
    return {"name": spec.name, "data_type": triton_data_type(spec.datatype), "dims": dims}


def model_config_json(model: ServedModel) -> dict[str, Any]:
    """Triton's ModelConfig JSON for one served version (see the module docstring)."""
    batching = model.config.batching
    batched = _batches(model)
    platform, backend = PLATFORMS.get(model.platform, (model.platform, model.platform))
    on_cpu = "cpu" in model.provider.lower() or model.platform == "pipeline"
    group: dict[str, Any] = {
        "name": model.name,
        "kind": "KIND_CPU" if on_cpu else "KIND_GPU",
        "count": batching.instances,
    }
    if not on_cpu:
        group["gpus"] = [model.config.device_id]
    config: dict[str, Any] = {
        "name": model.name,
        "platform": platform,
        "backend": backend,
        "version_policy": {"all": {}},
        "max_batch_size": batching.max_batch_size if batched else 0,
        "input": [
            {**_tensor(s, batched), "format": "FORMAT_NONE", "is_shape_tensor": False}
            for s in model.inputs
        ],
        "output": [{**_tensor(s, batched), "is_shape_tensor": False} for s in model.outputs],
        "instance_group": [group],
        "default_model_filename": MODEL_FILE,
        "model_transaction_policy": {"decoupled": False},
    }
    if batched and batching.mode != "off":
        config["dynamic_batching"] = {
            "preferred_batch_size": list(batching.preferred_batch_sizes),
            "max_queue_delay_microseconds": round(batching.max_queue_delay_s * 1e6),
            "preserve_ordering": False,
        }
    return config
