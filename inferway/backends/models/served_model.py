"""What the model repository hands out and reports: a ready model version, the events its
reloads produce, and the not-found error the servers turn into a 404 / NOT_FOUND.

Kept apart from the repository so the servers can name these without importing the reload
machinery.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
from opentelemetry.trace import SpanContext

from inferway.backends.models.config import ModelConfig
from inferway.backends.models.scan import Fingerprint
from inferway.backends.runners.base import Runner, TensorSpec

__all__ = [
    "ModelExecutor",
    "ModelLoadError",
    "ModelNotFoundError",
    "RepositoryEvent",
    "ServedModel",
]


class ModelExecutor(Protocol):
    """Where a served version's requests go: a model's BatchExecutor, or a pipeline's
    PipelineExecutor (which runs its steps on their models' executors)."""

    @property
    def queue_depth(self) -> int: ...

    @property
    def in_flight_batches(self) -> int: ...

    def utilization(self) -> float: ...

    def rps(self) -> float: ...

    async def infer(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]: ...

    def submit(
        self,
        inputs: Mapping[str, np.ndarray],
        *,
        deadline: float | None = None,
        timeout: float | None = None,
        span_context: SpanContext | None = None,
        on_done: Callable[[asyncio.Future[dict[str, np.ndarray]]], None] | None = None,
    ) -> asyncio.Future[dict[str, np.ndarray]]: ...

    async def start(self) -> None: ...

    async def stop(self, drain: bool = True) -> None: ...


class ModelNotFoundError(LookupError):
    """No such model or version is being served; the message lists what is."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        return self.message


class ModelLoadError(RuntimeError):
    """A load asked for (Triton's ``.../load``) left the model with no version serving;
    the message carries each refused version's reason."""


@dataclass
class ServedModel:
    """One ready model version (or pipeline: ``platform`` "pipeline", no runners).
    ``executor`` is where requests go."""

    name: str
    version: str
    config: ModelConfig
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    executor: ModelExecutor
    load_seconds: float
    platform: str
    provider: str
    path: Path
    runners: tuple[Runner, ...] = field(repr=False, default=())
    fingerprint: Fingerprint = field(repr=False, default=())


@dataclass(frozen=True)
class RepositoryEvent:
    """What changed: ``loaded`` / ``reloaded`` (swapped in), ``unloaded`` (drained and gone),
    ``refused`` (failed to load; ``message`` says why)."""

    kind: Literal["loaded", "reloaded", "unloaded", "refused"]
    name: str
    version: str
    message: str = ""
    load_seconds: float | None = None
