"""Every way a request can fail, mapped once to the answer both protocols give (HTTP status,
gRPC code, message, retry hint), so the HTTP and gRPC front ends cannot drift apart."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from inferway.backends.batching.errors import (
    DeadlineExceededError,
    ExecutorClosedError,
    InvalidRequestError,
    QueueFullError,
)
from inferway.backends.models.served_model import ModelLoadError, ModelNotFoundError
from inferway.backends.serving.input_validation import InferInputError

__all__ = [
    "CLIENT_GONE",
    "BodyTimeoutError",
    "Failure",
    "NotReadyError",
    "PayloadTooLargeError",
    "UnsupportedRequestError",
    "classify_error",
]

log = logging.getLogger("inferway.backends")


class NotReadyError(Exception):
    """The server has not finished loading its models."""


class UnsupportedRequestError(ValueError):
    """A well-formed request asking for something this server does not do (a Triton load
    parameter, another repository's name); the message says what and why."""


class BodyTimeoutError(Exception):
    """The request's body did not arrive within the body timeout (a client that sends part
    of it and then nothing): 408, and the connection is not kept."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the request body was not sent within {seconds:g} s")


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

    def code(self, wire: str) -> int | str:
        """The status the metrics and spans of ``wire`` ("http" or "grpc") name."""
        return self.http_status if wire == "http" else self.grpc_code.name


CLIENT_GONE = Failure(499, grpc.StatusCode.CANCELLED, "the client went away before its answer")
"""A request whose caller hung up or cancelled: nobody reads the answer, but it is counted
(HTTP 499 as nginx logs it, gRPC CANCELLED) and, if still queued, never computed."""


def classify_error(
    exc: BaseException, *, request_id: str | None = None, model: str | None = None
) -> Failure:
    """Map an exception to its protocol answer; anything unexpected is a logged 500, whose
    line carries the request's ``request_id`` (x-request-id) and ``model`` fields."""
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, InferInputError | InvalidRequestError | UnsupportedRequestError):
        return Failure(400, grpc.StatusCode.INVALID_ARGUMENT, msg)
    if isinstance(exc, ModelLoadError):
        return Failure(400, grpc.StatusCode.INVALID_ARGUMENT, msg)
    if isinstance(exc, ModelNotFoundError):
        return Failure(404, grpc.StatusCode.NOT_FOUND, msg)
    if isinstance(exc, BodyTimeoutError):
        return Failure(408, grpc.StatusCode.DEADLINE_EXCEEDED, msg)
    if isinstance(exc, PayloadTooLargeError):
        return Failure(413, grpc.StatusCode.RESOURCE_EXHAUSTED, msg)
    if isinstance(exc, QueueFullError):
        return Failure(429, grpc.StatusCode.RESOURCE_EXHAUSTED, msg, exc.retry_after_s)
    if isinstance(exc, DeadlineExceededError | TimeoutError):
        return Failure(504, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded: " + msg)
    if isinstance(exc, NotReadyError | ExecutorClosedError):
        return Failure(503, grpc.StatusCode.UNAVAILABLE, msg)
    log.error(
        "inference request failed unexpectedly",
        exc_info=exc,
        extra={"request_id": request_id, "model": model},
    )
    return Failure(500, grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {msg}")
