"""Checking one request's tensors and naming what it may be batched with.

Requests are concatenated along their first dimension, so every input of a request must share
it, and only requests whose inputs agree on name, dtype and the remaining dimensions can share
a batch: that agreement is the shape key the scheduler groups by.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .errors import InvalidRequestError

__all__ = ["Inputs", "Outputs", "describe_inputs"]

Inputs = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]


ShapeKey = tuple[tuple[str, str, tuple[int, ...]], ...]
"""(name, dtype, shape past the first dimension) of every input, sorted by name."""


def describe_inputs(inputs: Inputs) -> tuple[int, int, ShapeKey]:
    """(rows, nbytes, shape_key) of one request; rows is the shared first dimension."""
    if not inputs:
        raise InvalidRequestError("request has no inputs")
    rows = -1
    nbytes = 0
    parts = []
    for name, arr in inputs.items():
        if not isinstance(arr, np.ndarray) or arr.ndim == 0:
            raise InvalidRequestError(
                f"input {name!r}: expected a numpy array with a batch dimension first"
            )
        n = arr.shape[0]
        if rows < 0:
            rows = n
        elif n != rows:
            raise InvalidRequestError(
                f"input {name!r}: batch dimension {n} differs from the other inputs' {rows}"
            )
        nbytes += arr.nbytes
        parts.append((name, arr.dtype.str, arr.shape[1:]))
    if rows < 1:
        raise InvalidRequestError("request has an empty batch dimension (0 rows)")
    parts.sort()
    return rows, nbytes, tuple(parts)
