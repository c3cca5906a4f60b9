"""Plain data passed between the scheduler, the executor and observers."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

__all__ = [
    "IDLE",
    "BatchRecord",
    "Dispatch",
    "Idle",
    "Pending",
    "RequestState",
    "WaitUntil",
]


class RequestState(Enum):
    """Where a request is; every accepted request ends in exactly one of the last three."""

    QUEUED = "queued"
    DISPATCHED = "dispatched"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


@dataclass(slots=True, eq=False)
class Pending:
    """One request waiting to be batched.

    ``rows`` is its size along the batch axis; ``shape_key`` identifies what it may be batched
    with (dtype and non-batch dims of every input); ``deadline`` is on the scheduler's clock.
    The executor queues a subclass that also carries the inputs and the caller's future
    (``QueuedRequest``); the scheduler reads only these fields.
    """

    id: Hashable
    rows: int
    nbytes: int
    shape_key: Hashable
    arrival: float
    deadline: float | None = None
    state: RequestState = RequestState.QUEUED
    seq: int = field(default=0, repr=False)


RequestT = TypeVar("RequestT", bound=Pending)


@dataclass(frozen=True, slots=True)
class Dispatch(Generic[RequestT]):
    """Run these requests now, as one batch, in this order (they share one shape_key)."""

    requests: tuple[RequestT, ...]
    rows: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Nothing to run yet; ask again at ``at`` (or earlier, when something changes)."""

    at: float


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to run and nothing to wait for until something changes."""


IDLE = Idle()


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """What one executed batch looked like, for metrics and benchmarks."""

    name: str
    size_rows: int
    requests: int
    queue_wait_s: list[float]
    compute_s: float
    started_at: float
    instance: int = 0
    error: str | None = None
