"""The executor's record of one queued request: the scheduler's ``Pending`` plus what answering
it needs. A subclass rather than a payload beside it, so queueing a request allocates one
object, and every field is named and typed."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from opentelemetry.trace import SpanContext

from .inputs import Inputs, Outputs
from .records import Pending

__all__ = ["QueuedRequest"]


@dataclass(slots=True, eq=False, kw_only=True)
class QueuedRequest(Pending):
    """``inputs`` (batch dimension first), the ``future`` that gets its rows, and the
    ``span_context`` of the caller that batch spans link to."""

    inputs: Inputs
    future: asyncio.Future[Outputs]
    span_context: SpanContext
