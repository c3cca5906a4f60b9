"""One batch's tensors: the requests' inputs joined along the first dimension, and the
runner's outputs split back into each request's rows (checked to have one row per input row),
and one batch computed with them (``run_batch``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..runners.base import Runner
from .inputs import Inputs, Outputs
from .records import Dispatch

__all__ = ["join_inputs", "run_batch", "split_outputs"]


class _Rows(Protocol):
    @property
    def inputs(self) -> Inputs: ...

    @property
    def rows(self) -> int: ...


def join_inputs(requests: Sequence[_Rows]) -> Inputs:
    """The batch's inputs: each name's arrays concatenated in request order."""
    if len(requests) == 1:
        return requests[0].inputs
    first = requests[0].inputs
    return {n: np.concatenate([r.inputs[n] for r in requests]) for n in first}


def split_outputs(
    model: str, outputs: Mapping[str, np.ndarray], requests: Sequence[_Rows], rows: int
) -> list[Outputs]:
    """Each request's slice of ``outputs``; RuntimeError when an output does not have
    ``rows`` rows first (the model broke the batch dimension)."""
    for out_name, arr in outputs.items():
        if getattr(arr, "ndim", 0) == 0 or arr.shape[0] != rows:
            raise RuntimeError(
                f"model {model!r}: output {out_name!r} has shape "
                f"{getattr(arr, 'shape', None)}, expected {rows} rows first"
            )
    if len(requests) == 1:
        return [dict(outputs)]
    results = []
    offset = 0
    for r in requests:
        end = offset + r.rows
        results.append({n: a[offset:end] for n, a in outputs.items()})
        offset = end
    return results


def run_batch(
    model: str, runner: Runner, batch: Dispatch[Any], clock: Callable[[], float]
) -> tuple[list[Outputs], float]:
    """Concatenate, run, split (on whichever thread computes the batch): each request's rows
    and the seconds it took on ``clock``, which feed the cost model."""
    t0 = clock()
    outputs = runner.run(join_inputs(batch.requests))
    return split_outputs(model, outputs, batch.requests, batch.rows), clock() - t0
