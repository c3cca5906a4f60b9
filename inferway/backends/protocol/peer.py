"""Whether an HTTP client is still connected, asked without the event loop: under load the loop
reads a client's FIN late, after the batch its request joined was computed (see
batching/client_gone.py)."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import socket
from collections.abc import Callable

from inferway.backends.batching.client_gone import GoneCheck

__all__ = ["transport_gone_check"]

_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT
_STILL_THERE = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR})


def _socket_peek_closed(fd: int, family: int) -> bool:
    """A non-blocking peek at the socket: b"" is the client's FIN, an error a reset; bytes
    waiting (a pipelined request) or none at all mean it is still there."""
    try:
        sock = socket.socket(family, socket.SOCK_STREAM, 0, fileno=fd)
    except OSError:  # closed, or no socket: nobody to answer
        return True
    try:
        return sock.recv(1, _PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        sock.detach()  # the transport owns the descriptor


def _libc_peek() -> Callable[[int, int], bool] | None:
    """The same peek as one ``recv(2)`` call through the C library, where there is one: a
    Python socket object over the descriptor costs an object and a ``getsockname(2)`` (CPython
    checks the descriptor) on every check, about half of it (2.7 against 1.8 µs a check)."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)  # keeps the GIL: the call never blocks
        recv = libc.recv
    except (OSError, AttributeError, TypeError):  # no C library to call by name
        return None
    recv.restype = ctypes.c_ssize_t
    recv.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    scratch = ctypes.create_string_buffer(1)  # the peeked byte is not read

    def closed(fd: int, family: int) -> bool:
        n: int = recv(fd, scratch, 1, _PEEK)
        if n < 0:
            return ctypes.get_errno() not in _STILL_THERE
        return n == 0

    return closed


_peer_closed: Callable[[int, int], bool] = _libc_peek() or _socket_peek_closed


def transport_gone_check(transport: asyncio.BaseTransport) -> GoneCheck | None:
    """A check that says True once ``transport``'s client has closed or reset its side; None
    when the transport has no TCP socket to look at."""
    raw = transport.get_extra_info("socket")
    if raw is None or raw.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    fd, family = raw.fileno(), raw.family
    closed = _peer_closed

    def gone() -> bool:
        return transport.is_closing() or closed(fd, family)

    return gone
