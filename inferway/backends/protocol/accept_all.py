"""Take every connection waiting on a listening socket in one pass of the event loop.

uvloop (libuv) accepts one connection per pass of its loop. A server whose pass is long,
because it computed a batch on the loop or answered many requests, then takes one new
connection per pass while the rest wait in the kernel's accept queue: with a connection per
request, the batches shrink to what one pass admits, down to one row (issue 37's one-row
state: every batch one row, computed on the loop, about 50 connections waiting in the
queue). asyncio's own loop, like nginx's ``multi_accept``, takes all that are waiting; this
does the same for uvloop: a reader on each listening socket accepts until the queue is empty
(at most ``ACCEPT_PER_PASS`` a pass, so a flood cannot hold the loop) and hands each
connection to the loop as a transport (``loop.connect_accepted_socket``: TLS as the server's
own), so that the requests read in the next pass share a batch.

Out of descriptors (or kernel memory), accepting stops for ``RETRY_AFTER_S`` with a warning,
as asyncio does, instead of a level-triggered reader spinning on the error.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import ssl
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

__all__ = ["ACCEPT_PER_PASS", "RETRY_AFTER_S", "AcceptAll"]

log = logging.getLogger(__name__)

ACCEPT_PER_PASS = 128
"""Connections taken in one pass at most; the rest wait for the next."""
RETRY_AFTER_S = 1.0
"""How long accepting pauses when the process or the kernel has no room for a connection."""
_NO_ROOM = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_FINISHING: set[asyncio.Task[None]] = set()
"""Tasks finishing a set-up that yielded no future: held until done (the loop keeps tasks
only weakly)."""


class AcceptAll:
    """Accept on ``listening`` (bound sockets, such as an ``asyncio.Server``'s created with
    ``start_serving=False``; each is listened on through a duplicate of its descriptor, which
    this object owns) and give every connection a ``protocol_factory()`` protocol."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        listening: Sequence[Any],
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        *,
        ssl_context: ssl.SSLContext | None,
        backlog: int,
        retry_after_s: float = RETRY_AFTER_S,
    ) -> None:
        self._loop = loop
        self._factory = protocol_factory
        self._ssl = ssl_context
        self._retry_after_s = retry_after_s
        self._sockets: list[socket.socket] = []
        self._retries: dict[int, asyncio.TimerHandle] = {}  # by descriptor, while paused
        self.accepted = 0
        """Connections taken since start."""
        for bound in listening:
            sock = socket.socket(fileno=os.dup(bound.fileno()))
            self._sockets.append(sock)
            sock.listen(backlog)
            sock.setblocking(False)
            loop.add_reader(sock.fileno(), self._ready, sock)

    def close(self) -> None:
        """Stop accepting and close the duplicates (the listening sockets close with the last
        descriptor, their server's)."""
        for handle in self._retries.values():
            handle.cancel()
        self._retries.clear()
        for sock in self._sockets:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets.clear()

    def _ready(self, sock: socket.socket) -> None:
        for _ in range(ACCEPT_PER_PASS):
            try:
                conn, _address = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in _NO_ROOM:
                    self._pause(sock, exc)
                else:  # gone before it was taken (a reset), or another transient failure
                    log.debug("accept on %s failed: %s", sock.getsockname(), exc)
                return
            self.accepted += 1
            try:
                coroutine = self._loop.connect_accepted_socket(self._factory, conn, ssl=self._ssl)
            except Exception:
                log.exception("could not take a connection from %s", sock.getsockname())
                conn.close()
                continue
            _drive(coroutine)

    def _pause(self, sock: socket.socket, exc: OSError) -> None:
        log.warning(
            "accepting on %s paused for %.0f s: %s (too many open connections?)",
            sock.getsockname(),
            self._retry_after_s,
            exc,
        )
        fd = sock.fileno()
        self._loop.remove_reader(fd)
        self._retries[fd] = self._loop.call_later(self._retry_after_s, self._resume, sock)

    def _resume(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        del self._retries[fd]
        self._loop.add_reader(fd, self._ready, sock)


def _drive(coroutine: Coroutine[Any, Any, Any]) -> None:
    """Run ``coroutine`` (``connect_accepted_socket``: it makes the transport at once, then
    waits for ``connection_made``) without a task of its own: resumed by each future it waits
    on. A task costs about 5 µs a connection (42.5 µs a connection served by uvloop's own
    accept, 53.8 driven so, 58.8 with a task, in a micro-benchmark). A bare yield (no
    future) hands the rest to a task. A failure (a TLS handshake that did not complete) is
    the client's: logged at debug."""
    try:
        waited = coroutine.send(None)
    except StopIteration:
        return
    except (Exception, asyncio.CancelledError) as exc:  # the loop stopping cancels its wait
        log.debug("a connection closed while being set up: %r", exc)
        return
    if isinstance(waited, asyncio.Future):
        waited.add_done_callback(lambda _done: _drive(coroutine))
    else:
        task = asyncio.get_running_loop().create_task(_finish(coroutine))
        _FINISHING.add(task)
        task.add_done_callback(_FINISHING.discard)


async def _finish(coroutine: Coroutine[Any, Any, Any]) -> None:
    try:
        await coroutine
    except (Exception, asyncio.CancelledError) as exc:
        log.debug("a connection closed while being set up: %r", exc)
