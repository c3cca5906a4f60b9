"""Whether an HTTP client is still connected, asked without the event loop: under load the loop
reads a client's FIN late, after the batch its request joined was computed (see
batching/client_gone.py)."""

from __future__ import annotations

import asyncio
import socket

from inferway.backends.batching.client_gone import GoneCheck

__all__ = ["transport_gone_check"]

_PEEK = socket.MSG_PEEK | socket.MSG_DONTWAIT


def _peer_closed(fd: int, family: int) -> bool:
    """A non-blocking peek at the socket: b"" is the client's FIN, an error a reset; bytes
    waiting (a pipelined request) or none at all mean it is still there."""
    sock = socket.socket(family, socket.SOCK_STREAM, 0, fileno=fd)
    try:
        return sock.recv(1, _PEEK) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    finally:
        sock.detach()  # the transport owns the descriptor


def transport_gone_check(transport: asyncio.BaseTransport) -> GoneCheck | None:
    """A check that says True once ``transport``'s client has closed or reset its side; None
    when the transport has no TCP socket to look at."""
    raw = transport.get_extra_info("socket")
    if raw is None or raw.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    fd, family = raw.fileno(), raw.family

    def gone() -> bool:
        return transport.is_closing() or _peer_closed(fd, family)

    return gone
