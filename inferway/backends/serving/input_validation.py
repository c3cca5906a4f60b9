"""Checks a request's tensors against the protocol and the model, before any bytes are decoded.

Shared by the JSON, binary and gRPC codecs so the same mistake gets the same message on every
transport. Every rejection raises :class:`InferInputError` naming the tensor and what was wrong;
the servers turn it into a 400 / INVALID_ARGUMENT without guessing. ``DATATYPES`` lives here
because a datatype the table lacks is the first thing a request is refused for; its dtypes are
little-endian because that is the wire order the binary extension mandates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inferway.backends.runners.base import TensorSpec

__all__ = [
    "DATATYPES",
    "InferInputError",
    "datatype_of",
    "parse_shape",
    "shape_text",
    "validate_input",
    "validate_request_inputs",
]

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_BY_KIND_SIZE = {(dt.kind, dt.itemsize): name for name, dt in DATATYPES.items() if name != "BYTES"}


class InferInputError(ValueError):
    """The request is malformed or does not fit the model; the message names what and where."""


def datatype_of(array: np.ndarray) -> str:
    """The protocol datatype name of a numpy array (object/str/bytes arrays are BYTES)."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    name = _BY_KIND_SIZE.get((array.dtype.kind, array.dtype.itemsize))
    if name is None:
        raise TypeError(f"numpy dtype {array.dtype} has no Open Inference Protocol datatype")
    return name


def shape_text(shape: Sequence[int]) -> str:
    """Shapes in messages as the protocol writes them: ``[2, 3]``, not ``(2, 3)``."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def parse_shape(name: str, shape: Any) -> tuple[int, ...]:
    """A JSON shape, refused unless it is a list of non-negative integers (``true`` is an
    int to Python, so booleans are excluded explicitly)."""
    if not isinstance(shape, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape
    ):
        raise InferInputError(f"input '{name}': shape must be a list of integers, got {shape!r}")
    if any(d < 0 for d in shape):
        raise InferInputError(f"input '{name}': shape {shape_text(shape)} has a negative size")
    return tuple(shape)


def validate_input(
    name: str, datatype: str, shape: Sequence[int], specs: Mapping[str, TensorSpec]
) -> TensorSpec:
    """Check one input's name, datatype and shape (rank and fixed dims) against the model."""
    spec = specs.get(name)
    if spec is None:
        known = ", ".join(sorted(specs)) or "none"
        raise InferInputError(f"unknown input '{name}'; the model's inputs are: {known}")
    if datatype not in DATATYPES:
        raise InferInputError(f"input '{name}': unsupported datatype {datatype!r}")
    if datatype != spec.datatype:
        raise InferInputError(
            f"input '{name}': datatype {datatype} does not match the model's {spec.datatype}"
        )
    if len(shape) != len(spec.shape):
        raise InferInputError(
            f"input '{name}': shape {shape_text(shape)} has rank {len(shape)}, the model "
            f"expects rank {len(spec.shape)} {shape_text(spec.shape)}"
        )
    for axis, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
        if want >= 0 and got != want:
            raise InferInputError(
                f"input '{name}': dimension {axis} is {got}, the model expects {want} "
                f"(model shape {shape_text(spec.shape)})"
            )
    return spec


def validate_request_inputs(inputs: Mapping[str, np.ndarray], specs: Sequence[TensorSpec]) -> None:
    """Every model input present, and all inputs agree on the batch size (first dimension)."""
    missing = [s.name for s in specs if s.name not in inputs]
    if missing:
        raise InferInputError(f"missing input(s): {', '.join(missing)}")
    rows = {name: arr.shape[0] for name, arr in inputs.items() if arr.ndim > 0}
    if any(r == 0 for r in rows.values()):
        raise InferInputError("inputs must hold at least one row (first dimension is 0)")
    if len(set(rows.values())) > 1:
        detail = ", ".join(f"{n}={r}" for n, r in rows.items())
        raise InferInputError(f"inputs disagree on the batch size (first dimension): {detail}")
