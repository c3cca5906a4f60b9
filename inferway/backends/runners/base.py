"""What every runner (ONNX Runtime, TensorRT) offers the batching layer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["Runner", "TensorSpec"]


@dataclass(frozen=True)
class TensorSpec:
    """An input or output as the model declares it. ``datatype`` uses the Open Inference
    Protocol names (FP32, INT64, ...); ``-1`` in ``shape`` is a dynamic dimension."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@runtime_checkable
class Runner(Protocol):
    """One loaded instance of one model version. ``run`` blocks; the batching layer calls it
    from a worker thread, one call at a time per instance."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    provider: str
    """Which engine actually executes, e.g. 'CPUExecutionProvider' or 'tensorrt'."""

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...
