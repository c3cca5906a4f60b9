"""TCP ports the OS says are free now, for processes that will bind them a moment later.

Two hazards lie between picking a port and binding it:

- Picking ports one at a time (bind to 0, read the port, close) can hand out the same number
  twice: Linux chooses a random free port for each bind, and a closed one is free again. Two
  of a process's ports picked that way (Envoy's admin port and a listener, say) then collide
  only once they are bound, far from where they were chosen. ``free_ports`` keeps every
  socket bound until all the ports are picked, so the numbers it returns are all different.
- A port in the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768-60999 by
  default) can be taken in the meantime by anything that binds port 0 or opens an outgoing
  connection: the client side of every connection gets one. So ``free_ports`` picks from just
  below that range, where the kernel never hands out a port by itself, and falls back to a
  port the kernel picks only when no such port is free (or the range starts too low).

Just below that range also lie the ports inferway's own servers bind by default
(:data:`INFERWAY_DEFAULT_PORTS`); those are never handed out, so a picked port cannot meet a
default a policy leaves in place (a policy with the LLM processor's reports port on 18091 is
refused: the feature router's)."""

from __future__ import annotations

import contextlib
import errno
import random
import socket
from collections.abc import Collection, Iterator
from functools import cache
from pathlib import Path

__all__ = ["INFERWAY_DEFAULT_PORTS", "ephemeral_range", "free_port", "free_ports"]

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_RANGE = (32768, 60999)  # Linux's default, also where the file cannot be read
_BELOW = 16384  # how many ports under the ephemeral range to pick from
_LOWEST = 10000  # never below this: well-known and registered services sit lower
_TRIES = 64  # candidates tried under the range before letting the kernel pick
INFERWAY_DEFAULT_PORTS = frozenset({18000, *range(18091, 18097)})
"""Ports inferway's servers bind unless told otherwise: the xDS server (18000); the feature
router, the LLM processor and its reports port, the picker's two, the mask sink (18091-18096).
``tests/unit/test_free_ports.py`` holds this to the defaults themselves."""


@cache
def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out by itself (first, last), from /proc where it can."""
    try:
        first, last = (int(part) for part in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_RANGE
    return first, last


def _candidates() -> Iterator[int]:
    """Port numbers to try in turn: random ones under the ephemeral range, then 0."""
    first = ephemeral_range()[0]
    low = max(_LOWEST, first - _BELOW)
    if first - low >= _TRIES:
        for port in random.sample(range(low, first), _TRIES):
            if port not in INFERWAY_DEFAULT_PORTS:
                yield port
    while True:
        yield 0


def free_ports(*hosts: str, avoid: Collection[int] = ()) -> list[int]:
    """One port free right now on each of ``hosts`` (IPv4 or IPv6 addresses), in the order
    given, no two the same number and none in ``avoid`` (ports named elsewhere that are not
    bound yet, such as the ones a user gave on the command line)."""
    ports: list[int] = []
    with contextlib.ExitStack() as held:
        for host in hosts:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            for candidate in _candidates():
                if candidate and (candidate in ports or candidate in avoid):
                    continue
                sock = held.enter_context(socket.socket(family, socket.SOCK_STREAM))
                try:
                    sock.bind((host, candidate))
                except OSError as exc:
                    sock.close()
                    if exc.errno != errno.EADDRINUSE or not candidate:
                        raise
                    continue
                port = int(sock.getsockname()[1])
                if port not in ports and port not in avoid:  # else keep it held, pick again
                    ports.append(port)
                    break
    return ports


def free_port(host: str = "127.0.0.1") -> int:
    """One port free right now on ``host``; for several at once use ``free_ports``."""
    return free_ports(host)[0]
