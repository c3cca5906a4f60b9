"""Adaptive batching: a pure scheduler (``Scheduler``) and its asyncio shell (``BatchExecutor``)."""

from .config import BatchingConfig
from .cost_model import ArrivalRate, CostModel
from .errors import (
    BatchingError,
    DeadlineExceededError,
    ExecutorClosedError,
    InvalidRequestError,
    QueueFullError,
)
from .executor import BatchExecutor
from .records import IDLE, BatchRecord, Dispatch, Idle, Pending, RequestState, WaitUntil
from .scheduler import Scheduler

__all__ = [
    "IDLE",
    "ArrivalRate",
    "BatchExecutor",
    "BatchRecord",
    "BatchingConfig",
    "BatchingError",
    "CostModel",
    "DeadlineExceededError",
    "Dispatch",
    "ExecutorClosedError",
    "Idle",
    "InvalidRequestError",
    "Pending",
    "QueueFullError",
    "RequestState",
    "Scheduler",
    "WaitUntil",
]
