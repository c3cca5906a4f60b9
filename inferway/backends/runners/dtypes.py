"""One table between the three type systems a tensor crosses: the Open Inference Protocol
names on the wire, numpy in the process, and ONNX element types in the model file."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

__all__ = [
    "DATATYPES",
    "datatype_from_numpy",
    "datatype_from_onnx",
    "datatype_from_ort",
    "numpy_dtype",
    "onnx_elem_type",
]

# datatype -> (numpy dtype, ONNX TensorProto element type, onnxruntime type string)
_TABLE: dict[str, tuple[np.dtype, int, str]] = {
    "BOOL": (np.dtype(np.bool_), TensorProto.BOOL, "tensor(bool)"),
    "UINT8": (np.dtype(np.uint8), TensorProto.UINT8, "tensor(uint8)"),
    "UINT16": (np.dtype(np.uint16), TensorProto.UINT16, "tensor(uint16)"),
    "UINT32": (np.dtype(np.uint32), TensorProto.UINT32, "tensor(uint32)"),
    "UINT64": (np.dtype(np.uint64), TensorProto.UINT64, "tensor(uint64)"),
    "INT8": (np.dtype(np.int8), TensorProto.INT8, "tensor(int8)"),
    "INT16": (np.dtype(np.int16), TensorProto.INT16, "tensor(int16)"),
    "INT32": (np.dtype(np.int32), TensorProto.INT32, "tensor(int32)"),
    "INT64": (np.dtype(np.int64), TensorProto.INT64, "tensor(int64)"),
    "FP16": (np.dtype(np.float16), TensorProto.FLOAT16, "tensor(float16)"),
    "FP32": (np.dtype(np.float32), TensorProto.FLOAT, "tensor(float)"),
    "FP64": (np.dtype(np.float64), TensorProto.DOUBLE, "tensor(double)"),
    # Strings travel as numpy object arrays of bytes.
    "BYTES": (np.dtype(object), TensorProto.STRING, "tensor(string)"),
}

DATATYPES: tuple[str, ...] = tuple(_TABLE)
_BY_NUMPY = {v[0]: k for k, v in _TABLE.items()}
_BY_ONNX = {v[1]: k for k, v in _TABLE.items()}
_BY_ORT = {v[2]: k for k, v in _TABLE.items()}


def _known(datatype: str) -> tuple[np.dtype, int, str]:
    try:
        return _TABLE[datatype]
    except KeyError:
        raise ValueError(
            f"unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        ) from None


def numpy_dtype(datatype: str) -> np.dtype:
    """numpy dtype for an Open Inference Protocol datatype (BYTES -> object)."""
    return _known(datatype)[0]


def onnx_elem_type(datatype: str) -> int:
    """ONNX ``TensorProto`` element type for an Open Inference Protocol datatype."""
    return _known(datatype)[1]


def datatype_from_numpy(dtype: np.dtype | type) -> str:
    """Open Inference Protocol datatype of a numpy dtype; bytes/str arrays map to BYTES."""
    dt = np.dtype(dtype)
    if dt.kind in ("S", "U", "O"):
        return "BYTES"
    try:
        return _BY_NUMPY[dt.newbyteorder("=")]
    except KeyError:
        raise ValueError(f"numpy dtype {dt} has no Open Inference Protocol datatype") from None


def datatype_from_onnx(elem_type: int) -> str:
    """Open Inference Protocol datatype of an ONNX element type (e.g. ``TensorProto.FLOAT``)."""
    try:
        return _BY_ONNX[elem_type]
    except KeyError:
        name = (
            TensorProto.DataType.Name(elem_type)
            if elem_type in TensorProto.DataType.values()
            else elem_type
        )
        raise ValueError(
            f"ONNX element type {name} has no Open Inference Protocol datatype"
        ) from None


def datatype_from_ort(type_str: str) -> str:
    """Open Inference Protocol datatype of an onnxruntime type string like ``tensor(float)``."""
    try:
        return _BY_ORT[type_str]
    except KeyError:
        raise ValueError(
            f"onnxruntime type {type_str!r} has no Open Inference Protocol datatype"
        ) from None
