"""One start/stop protocol for the parts of a gateway, and the list that runs them.

Every part (xDS server, watchers, admin API, Envoy's supervisor, the loops) is a
:class:`Component`: ``start()`` once, ``stop()`` once. :class:`Components` starts them in
order and stops them in reverse, so the composition root reads as the list of what runs, and
a failure part-way stops what had started (a ``start`` that raises cleans up after itself).
Each stop is supervised: one that raises is logged and the
others still stop; the first error is raised once everything stopped.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = ["Calls", "Component", "Components", "Held", "Stop"]

log = logging.getLogger(__name__)

Stop = Callable[[], object]
"""Stops a part; may return an awaitable (awaited) or anything else (ignored)."""


class Component(Protocol):
    async def start(self) -> None:
        """Start; returns once running (raises when it cannot)."""

    async def stop(self) -> object:
        """Stop what ``start`` started."""


C = TypeVar("C", bound=Component)


@dataclass(frozen=True)
class Calls:
    """A component from two calls, for a part whose own start takes arguments."""

    start_call: Callable[[], Awaitable[object]]
    stop_call: Callable[[], Awaitable[object]]

    async def start(self) -> None:
        await self.start_call()

    async def stop(self) -> object:
        return await self.stop_call()


@dataclass(frozen=True, eq=False)
class Held:
    """A running part waiting for its place in the stop order (see :meth:`Components.own`)."""

    name: str
    stop: Stop


class Components:
    """Started parts in start order; :meth:`stop` stops them in reverse.

    :meth:`start` runs a :class:`Component`; :meth:`adopt` takes the stop of a part started
    otherwise (a server a factory started, a temporary folder). A part running before its
    place in the stop order comes (built by an earlier step) is :meth:`hold`-ed until
    :meth:`own` puts it there; held parts stop first."""

    def __init__(self) -> None:
        self._owned: list[tuple[str, Stop]] = []
        self._held: list[Held] = []

    async def start(self, name: str, component: C) -> C:
        """Start ``component`` (``name`` is for the log) and return it; it stops at this
        place of the order (not at all when its start raises)."""
        await component.start()
        self._owned.append((name, component.stop))
        return component

    def adopt(self, name: str, stop: Stop) -> None:
        """A part already running: ``stop()`` at this place of the order."""
        self._owned.append((name, stop))

    def hold(self, name: str, stop: Stop) -> Held:
        """A part already running, whose place in the stop order comes later (:meth:`own`)."""
        held = Held(name, stop)
        self._held.append(held)
        return held

    def own(self, held: Held) -> None:
        """Stop the ``held`` part at this place of the order."""
        self._held.remove(held)
        self._owned.append((held.name, held.stop))

    async def stop(self) -> None:
        """Stop every part: the held ones, then the others in reverse start order."""
        first: BaseException | None = None
        while self._held or self._owned:
            if self._held:
                held = self._held.pop()
                name, stop = held.name, held.stop
            else:
                name, stop = self._owned.pop()
            try:
                result = stop()
                if inspect.isawaitable(result):
                    await result
            except BaseException as error:  # the others must still stop
                if isinstance(error, Exception):
                    log.exception("stopping the %s failed", name)
                first = first or error
        if first is not None:
            raise first
