"""The binary tensor data extension: raw little-endian tensors after the JSON header.

Kept apart from the JSON codec because the gRPC codec reads ``raw_input_contents`` in exactly
this layout, and neither should depend on the other's document format.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from inferway.backends.serving.input_validation import (
    DATATYPES,
    InferInputError,
    datatype_of,
    shape_text,
)

__all__ = ["decode_raw_tensor", "encode_raw_tensor", "split_binary_body"]


def decode_raw_tensor(name: str, datatype: str, shape: Sequence[int], raw: bytes) -> np.ndarray:
    """Little-endian, row-major bytes -> array. BYTES elements carry a 4-byte LE length prefix."""
    count = math.prod(shape)
    if datatype == "BYTES":
        view = memoryview(raw)
        items: list[bytes] = []
        pos = 0
        while pos < len(view):
            if pos + 4 > len(view):
                raise InferInputError(f"input '{name}': truncated BYTES length prefix")
            size = int.from_bytes(view[pos : pos + 4], "little")
            pos += 4
            if pos + size > len(view):
                raise InferInputError(f"input '{name}': BYTES element overruns the tensor data")
            items.append(bytes(view[pos : pos + size]))
            pos += size
        if len(items) != count:
            raise InferInputError(
                f"input '{name}': raw data holds {len(items)} BYTES elements but shape "
                f"{shape_text(shape)} needs {count}"
            )
        return np.array(items, dtype=object).reshape(tuple(shape))
    dtype = DATATYPES[datatype]
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InferInputError(
            f"input '{name}': raw data is {len(raw)} bytes but shape {shape_text(shape)} "
            f"of {datatype} needs {expected}"
        )
    arr = np.frombuffer(raw, dtype=dtype).reshape(tuple(shape))
    return arr if arr.flags.aligned else arr.copy()


def encode_raw_tensor(array: np.ndarray) -> bytes:
    """The inverse of :func:`decode_raw_tensor`."""
    if datatype_of(array) == "BYTES":
        parts: list[bytes] = []
        for item in array.reshape(-1):
            blob = item if isinstance(item, bytes) else str(item).encode()
            parts.append(len(blob).to_bytes(4, "little"))
            parts.append(blob)
        return b"".join(parts)
    dtype = DATATYPES[datatype_of(array)]
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def split_binary_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """Split a request body into its JSON header and the binary tensor data after it."""
    if header_length is None:
        return body, b""
    try:
        length = int(header_length)
    except ValueError:
        raise InferInputError(
            f"Inference-Header-Content-Length must be an integer, got {header_length!r}"
        ) from None
    if length < 0 or length > len(body):
        raise InferInputError(
            f"Inference-Header-Content-Length is {length} but the body is only {len(body)} bytes"
        )
    return body[:length], body[length:]
