"""How the executor learns, when it forms a batch, that a queued request's client has gone.

A front end hears of a hang-up only when its event loop reads the FIN (or the stream's reset),
and under load that read waits behind the requests the loop is still decoding: the batch that
starts when an instance frees up would compute rows nobody waits for. So each front end sets
``client_gone_check`` to a cheap test of its client's connection (a peek at the socket, the
gRPC call's state) around the call that queues a request; the executor keeps the check with
the request and asks it for every request of a batch just before computing it. A context
variable, not a parameter: it reaches the executor through the serving core and pipelines
without changing their signatures, and costs nothing where no front end sets it."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

__all__ = ["GoneCheck", "client_gone_check"]

GoneCheck = Callable[[], bool]
"""True once the client of the request being queued can no longer receive its answer."""

client_gone_check: ContextVar[GoneCheck | None] = ContextVar("client_gone_check", default=None)
