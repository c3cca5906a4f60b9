"""Observers of the control plane: what is told when a policy is applied or refused, so
metrics, the rollouts, the replica manager and the followers of a policy's files attach from
outside and the apply logic stays free of them.

An observer implements :class:`PolicyObserver`; subclass :class:`PolicyFollower` (both
methods no-ops) and override what you watch. :class:`ObserverList` calls them in order, and
an exception raised by one is logged and swallowed: observing must never break applying.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # control_plane.py imports this module
    from inferway.gateway.control_plane import AppliedPolicy, Refusal

__all__ = ["ObserverList", "PolicyFollower", "PolicyObserver"]

log = logging.getLogger(__name__)


@runtime_checkable
class PolicyObserver(Protocol):
    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        """A policy is live; ``changed``: its snapshot differs from the one before."""

    def on_refused(self, refusal: Refusal) -> None:
        """A policy edit (or an Envoy's rejection of it) was refused; the last good stays."""


class PolicyFollower:
    """A :class:`PolicyObserver` that ignores both events: subclass it, override what you
    watch."""

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        return None

    def on_refused(self, refusal: Refusal) -> None:
        return None


class ObserverList:
    """The attached observers, told in the order they were added."""

    def __init__(self) -> None:
        self._observers: list[PolicyObserver] = []

    def add(self, observer: PolicyObserver) -> None:
        if not isinstance(observer, PolicyObserver):
            raise TypeError(
                f"{observer!r} is not a control-plane observer: subclass "
                "inferway.gateway.policy_observers.PolicyFollower"
            )
        self._observers.append(observer)

    def on_applied(self, applied: AppliedPolicy, changed: bool) -> None:
        self._each("on_applied", lambda observer: observer.on_applied(applied, changed))

    def on_refused(self, refusal: Refusal) -> None:
        self._each("on_refused", lambda observer: observer.on_refused(refusal))

    def _each(self, event: str, call: Callable[[PolicyObserver], None]) -> None:
        for observer in self._observers:
            try:
                call(observer)
            except Exception:  # observing must never break applying
                log.exception("control plane observer %r.%s failed", observer, event)
