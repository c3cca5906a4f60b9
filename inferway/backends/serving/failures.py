"""What the HTTP and gRPC servers share: running one request on a model under a deadline, and
turning every failure into one protocol answer (HTTP status, gRPC code, message)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from inferway.backends.batching.errors import (
    DeadlineExceededError,
    ExecutorClosedError,
    InvalidRequestError,
    QueueFullError,
)
from inferway.backends.models.served_model import ModelNotFoundError
from inferway.backends.serving.input_validation import InferInputError

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "Failure",
    "NotReadyError",
    "PayloadTooLargeError",
    "classify_error",
    "resolve_timeout_param",
    "run_inference",
]

log = logging.getLogger("inferway.backends")

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


class NotReadyError(Exception):
    """The server has not finished loading its models."""


class PayloadTooLargeError(Exception):
    """The request body is larger than the model (or server) accepts."""

    def __init__(self, size: int | None, limit: int, model: str = "") -> None:
        where = f" for model '{model}'" if model else ""
        got = f"{size} bytes" if size is not None else "more"
        super().__init__(f"request body of {got} exceeds the limit of {limit} bytes{where}")


@dataclass(frozen=True)
class Failure:
    """One failed request, as both protocols report it."""

    http_status: int
    grpc_code: grpc.StatusCode
    message: str
    retry_after_s: float | None = None


def classify_error(exc: BaseException) -> Failure:
    """Map an exception to its protocol answer; anything unexpected is a logged 500."""
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, InferInputError | InvalidRequestError):
        return Failure(400, grpc.StatusCode.INVALID_ARGUMENT, msg)
    if isinstance(exc, ModelNotFoundError):
        return Failure(404, grpc.StatusCode.NOT_FOUND, msg)
    if isinstance(exc, PayloadTooLargeError):
        return Failure(413, grpc.StatusCode.RESOURCE_EXHAUSTED, msg)
    if isinstance(exc, QueueFullError):
        return Failure(429, grpc.StatusCode.RESOURCE_EXHAUSTED, msg, exc.retry_after_s)
    if isinstance(exc, DeadlineExceededError | TimeoutError):
        return Failure(504, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded: " + msg)
    if isinstance(exc, NotReadyError | ExecutorClosedError):
        return Failure(503, grpc.StatusCode.UNAVAILABLE, msg)
    log.error("inference request failed unexpectedly", exc_info=exc)
    return Failure(500, grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {msg}")


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
    executor: Any, inputs: Mapping[str, np.ndarray], *, timeout_s: float | None
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
