"""Errors the batching layer raises to callers; each maps to one protocol status.

QueueFullError -> 429/RESOURCE_EXHAUSTED (with Retry-After), DeadlineExceededError ->
504/DEADLINE_EXCEEDED, ExecutorClosedError -> 503/UNAVAILABLE, InvalidRequestError -> 400.
"""

from __future__ import annotations

__all__ = [
    "BatchingError",
    "DeadlineExceededError",
    "ExecutorClosedError",
    "InvalidRequestError",
    "QueueFullError",
]


class BatchingError(Exception):
    """Base class of the errors below."""


class QueueFullError(BatchingError):
    """The model's queue is at ``max_queue_size``; the request was not accepted.

    ``retry_after_s`` estimates when the queue will have drained enough to accept it.
    """

    def __init__(self, retry_after_s: float, *, queue_size: int, model: str = "") -> None:
        self.retry_after_s = retry_after_s
        self.queue_size = queue_size
        self.model = model
        where = f"model {model!r}: " if model else ""
        super().__init__(
            f"{where}queue full ({queue_size} requests waiting); retry after {retry_after_s:.3f}s"
        )


class DeadlineExceededError(BatchingError, TimeoutError):
    """The request's deadline passed before it could be computed; it was never run."""


class ExecutorClosedError(BatchingError):
    """The model's executor is stopping or stopped and accepts no new requests."""


class InvalidRequestError(BatchingError, ValueError):
    """The request can never be batched as given (bad inputs, or larger than one batch)."""
