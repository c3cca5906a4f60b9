"""TCP ports the OS says are free now, for processes that will bind them a moment later.

Picking ports one at a time (bind to 0, read the port, close) can hand out the same number
twice: Linux chooses a random free port for each bind, and a closed one is free again. Two
of a process's ports picked that way (Envoy's admin port and a listener, say) then collide
only once they are bound, far from where they were chosen. ``free_ports`` keeps every socket
bound until all the ports are picked, so the numbers it returns are all different."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Collection

__all__ = ["free_port", "free_ports"]


def free_ports(*hosts: str, avoid: Collection[int] = ()) -> list[int]:
    """One port free right now on each of ``hosts`` (IPv4 or IPv6 addresses), in the order
    given, no two the same number and none in ``avoid`` (ports named elsewhere that are not
    bound yet, such as the ones a user gave on the command line)."""
    ports: list[int] = []
    with contextlib.ExitStack() as held:
        for host in hosts:
            while True:
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                sock = held.enter_context(socket.socket(family, socket.SOCK_STREAM))
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
                if port not in ports and port not in avoid:  # else keep it held, pick again
                    ports.append(port)
                    break
    return ports


def free_port(host: str = "127.0.0.1") -> int:
    """One port free right now on ``host``; for several at once use ``free_ports``."""
    return free_ports(host)[0]
