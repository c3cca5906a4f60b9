"""ONNX Runtime runner: the portable engine, and the fallback when native TensorRT is absent.

Provider choice follows what this onnxruntime build actually offers
(``ort.get_available_providers()``): TensorRT EP, then CUDA EP, then CPU. ``fp16`` maps to
the TensorRT EP's ``trt_fp16_enable``; the CUDA EP has no such switch (running FP16 there
means exporting an FP16 model), so it runs the model's own precision and says so in the log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnxruntime as ort

from inferway.backends.runners.base import TensorSpec
from inferway.backends.runners.dtypes import datatype_from_ort, numpy_dtype

__all__ = [
    "CPU",
    "CUDA",
    "TENSORRT",
    "OnnxRunner",
    "ProviderChoice",
    "ProviderUnavailableError",
    "resolve_providers",
]

log = logging.getLogger(__name__)

TENSORRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
_GPU_PROVIDERS = (TENSORRT, CUDA)
_PREFERENCE = (TENSORRT, CUDA, CPU)
_BY_CHOICE = {"tensorrt": TENSORRT, "cuda": CUDA, "cpu": CPU}

ProviderChoice = Literal["auto", "tensorrt", "cuda", "cpu"]


class ProviderUnavailableError(RuntimeError):
    """An execution provider was asked for by name but this onnxruntime build lacks it."""


def resolve_providers(choice: str, available: Sequence[str]) -> list[str]:
    """The ordered execution providers for a config ``provider`` value.

    ``auto`` takes every available one of TensorRT > CUDA > CPU. A named choice puts that
    provider first and keeps the cheaper ones behind it as fallbacks for unsupported nodes
    (``tensorrt`` -> TensorRT, CUDA, CPU) -- but only when the named one is available.
    """
    if choice == "auto":
        chosen = [p for p in _PREFERENCE if p in available]
        return chosen or [CPU]
    if choice not in _BY_CHOICE:
        raise ValueError(f"provider {choice!r} is not one of auto, tensorrt, cuda, cpu")
    wanted = _BY_CHOICE[choice]
    if wanted not in available:
        raise ProviderUnavailableError(
            f"provider {choice!r} ({wanted}) is not available in this onnxruntime build; "
            f"available: {', '.join(available) or 'none'}"
        )
    start = _PREFERENCE.index(wanted)
    return [p for p in _PREFERENCE[start:] if p in available or p == CPU]


WORKERS_ENV = "INFERWAY_WORKERS"
"""Set by ``inferway serve --workers N`` for its workers: the cores are shared N ways."""


def default_intra_op_threads(instances: int = 1) -> int:
    """Split the cores between the instances of a model (and between the worker processes of
    ``serve --workers``): on a 2-core box one instance gets both, two instances (or two
    workers) get one each, so they do not fight over the same cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        workers = max(1, int(os.environ.get(WORKERS_ENV, "1")))
    except ValueError:
        workers = 1
    return max(1, (cores or 1) // (max(1, instances) * workers))


def _spec(arg: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or ()))
    return TensorSpec(name=arg.name, datatype=datatype_from_ort(arg.type), shape=shape)


class OnnxRunner:
    """One ``InferenceSession`` over one ``model.onnx``. ``run`` blocks and is called by one
    thread at a time (the batching layer owns the instance); ``provider`` is the provider
    onnxruntime actually registered first, not the one that was asked for."""

    platform = "onnxruntime"

    def __init__(
        self,
        path: str | Path,
        *,
        providers: list[str] | None = None,
        fp16: bool = False,
        device_id: int = 0,
        intra_op_threads: int | None = None,
        trt_cache_dir: str | Path | None = None,
        model_bytes: bytes | None = None,
    ) -> None:
        self.path = Path(path)
        available = ort.get_available_providers()
        if providers is None:
            providers = resolve_providers("auto", available)
        missing = [p for p in providers if p not in available]
        if missing:
            raise ProviderUnavailableError(
                f"{self.path}: execution provider(s) {', '.join(missing)} not available; "
                f"available: {', '.join(available)}"
            )
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = intra_op_threads or default_intra_op_threads()
        options.inter_op_num_threads = 1
        # Spinning threads burn the cores the event loop and the other instances need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3

        provider_options: list[dict[str, Any]] = []
        for p in providers:
            if p == TENSORRT:
                cache = Path(trt_cache_dir) if trt_cache_dir else self.path.parent / ".trt_cache"
                provider_options.append(
                    {
                        "device_id": device_id,
                        "trt_fp16_enable": bool(fp16),
                        # A decrypted model's engine would be its plaintext on disk.
                        "trt_engine_cache_enable": model_bytes is None,
                        "trt_engine_cache_path": str(cache),
                        "trt_timing_cache_enable": True,
                    }
                )
            elif p == CUDA:
                provider_options.append({"device_id": device_id})
            else:
                provider_options.append({})
        if fp16 and TENSORRT not in providers:
            log.info(
                "%s: fp16 applies to the TensorRT execution provider only; running with %s "
                "in the model's own precision",
                self.path,
                providers[0],
            )
        try:
            self._session = ort.InferenceSession(
                model_bytes if model_bytes is not None else str(self.path),
                options,
                providers=providers,
                provider_options=provider_options,
            )
        except Exception as e:  # onnxruntime raises its own types; make them say where.
            raise RuntimeError(f"{self.path}: onnxruntime could not load the model: {e}") from e
        self.providers: tuple[str, ...] = tuple(self._session.get_providers())
        self.provider: str = self.providers[0]
        self.device_id = device_id
        self.inputs: tuple[TensorSpec, ...] = tuple(_spec(a) for a in self._session.get_inputs())
        self.outputs: tuple[TensorSpec, ...] = tuple(_spec(a) for a in self._session.get_outputs())
        self._output_names = [o.name for o in self.outputs]
        self._input_dtypes = {s.name: numpy_dtype(s.datatype) for s in self.inputs}
        self._use_io_binding = self.provider in _GPU_PROVIDERS

    def _check(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [n for n in self._input_dtypes if n not in inputs]
        extra = [n for n in inputs if n not in self._input_dtypes]
        if missing or extra:
            raise ValueError(
                f"{self.path}: inputs must be exactly {sorted(self._input_dtypes)}; "
                f"missing {missing}, unexpected {extra}"
            )
        feed = {}
        for name, dtype in self._input_dtypes.items():
            arr = inputs[name]
            if arr.dtype != dtype and dtype != np.dtype(object):
                raise ValueError(
                    f"{self.path}: input {name!r} has dtype {arr.dtype}, the model wants {dtype}"
                )
            feed[name] = arr
        return feed

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; returns output name -> host array."""
        feed = self._check(inputs)
        if not self._use_io_binding:
            results = self._session.run(self._output_names, feed)
            return dict(zip(self._output_names, results, strict=True))
        # GPU: copy inputs once up front and let ORT allocate outputs on the device, so the
        # run itself does no implicit host<->device copies.
        binding = self._session.io_binding()
        for name, arr in feed.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(arr))
        for name in self._output_names:
            binding.bind_output(name, "cuda", self.device_id)
        self._session.run_with_iobinding(binding)
        results = binding.copy_outputs_to_cpu()
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        return dict(zip(self._output_names, results, strict=True))

    def close(self) -> None:
        """Drop the session; onnxruntime frees its memory when the last reference goes."""
        self._session = None

    def __repr__(self) -> str:
        return f"OnnxRunner({str(self.path)!r}, provider={self.provider!r})"
