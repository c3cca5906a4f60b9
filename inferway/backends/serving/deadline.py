"""Running one request on a model's executor under a deadline, and reading the deadline a
request names for itself (the OIP ``timeout`` parameter)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from inferway.backends.batching.errors import DeadlineExceededError
from inferway.backends.models.served_model import ModelExecutor
from inferway.backends.serving.input_validation import InferInputError

__all__ = ["resolve_timeout_param", "run_inference"]


def resolve_timeout_param(parameters: Mapping[str, Any]) -> float | None:
    """The request's ``timeout`` parameter (microseconds, as Triton clients send it) in
    seconds; 0 or absent means no deadline."""
    value = parameters.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InferInputError(
            f"parameter 'timeout' must be a number of microseconds >= 0, got {value!r}"
        )
    return value / 1e6 if value > 0 else None


async def run_inference(
    executor: ModelExecutor, inputs: Mapping[str, np.ndarray], *, timeout_s: float | None
) -> dict[str, np.ndarray]:
    """``executor.infer`` under a deadline: the executor drops the request if the deadline
    passes while queued, and the wait is bounded here too, so a deadline always yields an
    answer in time."""
    if timeout_s is None:
        return await executor.infer(inputs)
    if timeout_s <= 0:
        raise DeadlineExceededError("the deadline had passed before the request was queued")
    deadline = time.monotonic() + timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            return await executor.infer(inputs, deadline=deadline)
    except TimeoutError as exc:
        if isinstance(exc, DeadlineExceededError):
            raise
        raise DeadlineExceededError(
            f"no result within the request's {timeout_s * 1000:.1f} ms deadline"
        ) from None
