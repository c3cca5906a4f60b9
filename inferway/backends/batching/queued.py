"""The executor's record of one queued request: the scheduler's ``Pending`` plus what answering
it needs. A subclass rather than a payload beside it, so queueing a request allocates one
object, and every field is named and typed."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from opentelemetry.trace import SpanContext

from .client_gone import GoneCheck
from .inputs import Inputs, Outputs
from .records import Pending

__all__ = ["QueuedRequest"]


@dataclass(slots=True, eq=False, kw_only=True)
class QueuedRequest(Pending):
    """``inputs`` (batch dimension first), the ``future`` that gets its rows, the
    ``span_context`` of the caller that batch spans link to, and ``gone``: the front end's
    check that its client hung up (batching/client_gone.py; None: no check)."""

    inputs: Inputs
    future: asyncio.Future[Outputs]
    span_context: SpanContext
    gone: GoneCheck | None = None
