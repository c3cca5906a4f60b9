"""Pick the engine for one model version from its config and what this machine offers."""

from __future__ import annotations

import logging
from pathlib import Path

import onnxruntime as ort

from inferway.backends.models.config import ModelConfig
from inferway.backends.runners.base import Runner
from inferway.backends.runners.onnx import (
    TENSORRT,
    OnnxRunner,
    ProviderUnavailableError,
    default_intra_op_threads,
    resolve_providers,
)
from inferway.backends.runners.tensorrt import TensorRTRunner, tensorrt_unavailable_reason

__all__ = ["build_runner"]

log = logging.getLogger(__name__)


def build_runner(
    path: str | Path, config: ModelConfig | None = None, *, model_bytes: bytes | None = None
) -> Runner:
    """One runner for ``path`` under ``config``.

    ``auto``: native TensorRT when ``tensorrt`` imports and a GPU is present (falling back to
    onnxruntime if the engine cannot be built), else onnxruntime with TensorRT EP > CUDA EP >
    CPU. ``tensorrt``: native TensorRT, else the TensorRT EP, else an error. ``cuda`` / ``cpu``:
    onnxruntime with that provider first; an unavailable one is an error naming what exists.
    ``model_bytes``: the model itself (a decrypted ``model.onnx.enc``), ``path`` only names it.
    """
    config = config or ModelConfig()
    path = Path(path)
    if config.provider in ("auto", "tensorrt"):
        reason = tensorrt_unavailable_reason(config.device_id)
        if reason is None:
            try:
                return TensorRTRunner(
                    path,
                    max_batch_size=config.batching.max_batch_size,
                    fp16=config.fp16,
                    device_id=config.device_id,
                    model_bytes=model_bytes,
                )
            except Exception as e:
                if config.provider == "tensorrt" and TENSORRT not in ort.get_available_providers():
                    raise
                log.warning("%s: native TensorRT failed (%s); using onnxruntime", path, e)
        elif config.provider == "tensorrt" and TENSORRT not in ort.get_available_providers():
            raise ProviderUnavailableError(
                f"{path}: provider 'tensorrt' requested but neither native TensorRT ({reason}) "
                f"nor the TensorRT execution provider is available; onnxruntime offers: "
                f"{', '.join(ort.get_available_providers())}"
            )
    try:
        providers = resolve_providers(config.provider, ort.get_available_providers())
    except ProviderUnavailableError as e:
        raise ProviderUnavailableError(f"{path}: {e}") from None
    return OnnxRunner(
        path,
        providers=providers,
        fp16=config.fp16,
        device_id=config.device_id,
        intra_op_threads=config.intra_op_threads or default_intra_op_threads(config.instances),
        model_bytes=model_bytes,
    )
