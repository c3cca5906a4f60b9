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

__all__ = ["QueuedRequest", "abandoned", "fail"]


@dataclass(slots=True, eq=False, kw_only=True)
class QueuedRequest(Pending):
    """``inputs`` (batch dimension first), the ``future`` that gets its rows, the
    ``span_context`` of the caller that batch spans link to, and ``gone``: the front end's
    check that its client hung up (batching/client_gone.py; None: no check)."""

    inputs: Inputs
    future: asyncio.Future[Outputs]
    span_context: SpanContext
    gone: GoneCheck | None = None


def abandoned(req: QueuedRequest) -> bool:
    """Whether nobody waits for ``req``'s rows: its caller gave up, or its client's connection
    says it hung up (then its future is cancelled here, so it is answered and counted as a
    client gone, as a cancel read by the loop would be)."""
    fut = req.future
    if fut.done():
        return True
    gone = req.gone
    if gone is not None and gone():
        fut.cancel()
        return True
    return False


def fail(req: QueuedRequest, exc: BaseException) -> None:
    """Answer ``req`` with ``exc``, unless it is answered (or cancelled) already."""
    fut = req.future
    if not fut.done():
        fut.set_exception(exc)
