"""The transformations ``inferway optimize`` applies, each one of ONNX Runtime's own tools:
``onnxruntime.quantization`` (dynamic or static INT8, per-channel weights), ORT's float16
converter (``onnxruntime.transformers.float16``, inputs and outputs kept FP32 so clients see
no change), and ORT's offline graph optimisation (``SessionOptions.optimized_model_filepath``).

Each step reads one ``model.onnx`` and writes another; none of them edits its source.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

from inferway.tools.optimize.inputs import iter_batches

__all__ = [
    "build_fp16",
    "build_graph_optimized",
    "build_int8_dynamic",
    "build_int8_static",
]


def build_fp16(src: Path, dst: Path) -> None:
    """Weights and arithmetic in FP16; the graph's inputs and outputs stay as they were."""
    from onnxruntime.transformers import float16

    model = float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    onnx.save(model, str(dst))


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """ORT's quantizer advises shape-inference pre-processing on the root logger for every
    model; the validation that follows is what tells whether the result is good."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def build_int8_dynamic(
    src: Path, dst: Path, *, per_channel: bool = True, reduce_range: bool = False
) -> None:
    """INT8 weights (per output channel), activations quantised at run time; ``reduce_range``
    keeps weights to 7 bits (``inferway.tools.optimize.int8_weights`` says when)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_quantizer():
        quantize_dynamic(
            str(src),
            str(dst),
            per_channel=per_channel,
            reduce_range=reduce_range,
            weight_type=QuantType.QInt8,
        )


def build_int8_static(
    src: Path,
    dst: Path,
    calibration: dict[str, np.ndarray],
    *,
    batch: int = 32,
    per_channel: bool = True,
    symmetric: bool = False,
    reduce_range: bool = False,
) -> None:
    """INT8 weights (per output channel) and activations, their ranges calibrated on
    ``calibration`` (MinMax), as QuantizeLinear/DequantizeLinear pairs (QDQ, which ORT and
    TensorRT both run as INT8). ``symmetric`` activations are what TensorRT needs;
    ``reduce_range`` keeps weights to 7 bits."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        """The calibration rows, in batches."""

        def __init__(self) -> None:
            self._batches: Iterator[dict[str, np.ndarray]] = iter_batches(calibration, batch)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._batches, None)

    with _quiet_quantizer():
        quantize_static(
            str(src),
            str(dst),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=per_channel,
            reduce_range=reduce_range,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True},
        )


def build_graph_optimized(src: Path, dst: Path) -> None:
    """ORT's extended graph optimisations (constant folding, redundant-node elimination,
    fusions such as Gemm+Relu) done once, offline, and saved. Extended, not "all": the
    layout optimisations of "all" tie the file to this machine's CPU; the serving session
    still applies them at load."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(dst)
    options.log_severity_level = 3
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    if not dst.is_file():
        raise RuntimeError(f"{src}: onnxruntime wrote no optimised model to {dst}")
